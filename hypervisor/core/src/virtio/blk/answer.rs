//! Answering a chain: the status byte, the used element and the interrupt
//! ([`VirtioBlk::answer`], `finish`), IOERR for a bad request (`reject`),
//! the [`BadChainPolicy`] for a chain with no usable status byte
//! (`unanswerable`) and DEVICE_NEEDS_RESET (`fail_device`). Both the
//! submission path and the completion path end here.

use super::super::mmio::Effects;
use super::super::queue::QueueError;
use super::super::{irq, GuestMemory, GuestMemoryExt};
use super::config::{BadChainPolicy, S_IOERR};
use super::error::RequestError;
use super::VirtioBlk;

impl VirtioBlk {
    /// Enter DEVICE_NEEDS_RESET (noting `e` if given).
    pub(super) fn fail_device(&mut self, e: Option<QueueError>) -> Effects {
        if let Some(e) = e {
            self.note(RequestError::Queue(e));
        }
        let mut fx = Effects::default();
        if !self.transport.needs_reset() {
            self.counters.needs_reset += 1;
            fx.irq_level_changed = self.transport.set_needs_reset();
        }
        fx
    }

    /// Publish `{head, len}` on queue `q` and raise the interrupt if wanted.
    pub(super) fn finish(&mut self, mem: &mut dyn GuestMemory, q: u16, head: u16, len: u32) -> Effects {
        let Some(queue) = self.transport.queues.get_mut(usize::from(q)) else {
            return Effects::default();
        };
        match queue.push_used(mem, head, len) {
            Ok(true) => {
                self.counters.interrupts += 1;
                Effects { notify: None, irq_level_changed: self.transport.raise(irq::VRING) }
            }
            Ok(false) => Effects::default(),
            Err(e) => self.fail_device(Some(e)),
        }
    }

    /// Write a status byte then publish; a status that cannot be written
    /// (checked earlier, so never in practice) fails the device.
    pub(super) fn answer(
        &mut self,
        mem: &mut dyn GuestMemory,
        q: u16,
        head: u16,
        status_gpa: u64,
        st: u8,
        written: u32,
    ) -> Effects {
        if let Err(e) = mem.write_u8(status_gpa, st) {
            return self.fail_device(Some(QueueError::Mem(e)));
        }
        self.finish(mem, q, head, written.saturating_add(1))
    }

    pub(super) fn unanswerable(&mut self, mem: &mut dyn GuestMemory, q: u16, head: u16, e: RequestError) -> Effects {
        self.counters.bad_chains += 1;
        self.note(e);
        match self.cfg.bad_chain_policy {
            BadChainPolicy::ReturnUnused => self.finish(mem, q, head, 0),
            BadChainPolicy::NeedsReset => self.fail_device(None),
        }
    }

    /// Answer IOERR.
    pub(super) fn reject(
        &mut self,
        mem: &mut dyn GuestMemory,
        q: u16,
        head: u16,
        status_gpa: u64,
        e: RequestError,
    ) -> Effects {
        self.counters.io_errors += 1;
        self.note(e);
        self.answer(mem, q, head, status_gpa, S_IOERR, 0)
    }
}
