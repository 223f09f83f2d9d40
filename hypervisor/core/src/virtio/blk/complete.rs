//! The backend's answer: [`VirtioBlk::complete`] retires the token, gives
//! its budget and quota charge back, copies read data into the guest and
//! writes the status, unless the request was orphaned by a reset (then
//! guest memory is left alone). A completion that frees room asks the
//! caller to process a stalled queue again.

use super::super::buf::DataBuf;
use super::super::mmio::Effects;
use super::super::GuestMemory;
use super::backend::{BackendError, Completion};
use super::config::{S_IOERR, S_OK};
use super::error::RequestError;
use super::stream::scatter_buf;
use super::{InFlight, Kind, VirtioBlk};

impl VirtioBlk {
    /// A backend finished request `c.token`: copy read data into the guest,
    /// write the status, publish the used element, raise the interrupt. A
    /// request orphaned by a reset only gives its budget back. If the device
    /// had left chains in the ring for want of room, the result's `notify`
    /// asks the caller to process that queue again.
    pub fn complete(&mut self, mem: &mut dyn GuestMemory, c: Completion) -> Effects {
        let Some(r) = self.in_flight.remove(&c.token) else {
            self.counters.unknown_completions += 1;
            return Effects::default();
        };
        self.counters.completions += 1;
        self.in_flight_bytes = self.in_flight_bytes.saturating_sub(u64::from(r.data_len));
        self.unhold(r.cost);
        self.update_in_flight();
        let mut fx = if r.orphaned {
            // The guest reset this queue after submitting: its memory is
            // no longer ours to write.
            self.orphans -= 1;
            self.counters.stale_completions += 1;
            Effects::default()
        } else if self.transport.needs_reset() {
            // The driver must reset; leave its memory alone meanwhile.
            Effects::default()
        } else {
            let (st, written) = self.outcome(mem, &r, &c.result);
            self.answer(mem, r.queue, r.head, r.status_gpa, st, written)
        };
        // Room was freed: resume a queue that had to stop.
        if let Some(q) = self.stalled.iter().position(|&s| s) {
            self.stalled[q] = false;
            fx.notify = Some(q as u16);
        }
        fx
    }

    /// The status (and bytes written) for the backend's `result` of `r`;
    /// read data is copied into the guest here.
    fn outcome(
        &mut self,
        mem: &mut dyn GuestMemory,
        r: &InFlight,
        result: &Result<DataBuf, BackendError>,
    ) -> (u8, u32) {
        match (result, r.kind) {
            (Ok(data), Kind::Read) if data.len() == r.data_len as usize => match scatter_buf(mem, &r.wsegs, data) {
                Ok(()) => {
                    self.counters.bytes_read += data.len() as u64;
                    (S_OK, r.data_len)
                }
                Err(e) => {
                    self.counters.io_errors += 1;
                    self.note(RequestError::Mem(e));
                    (S_IOERR, 0)
                }
            },
            (Ok(_), Kind::Read) => {
                self.counters.io_errors += 1;
                self.counters.backend_errors += 1;
                self.note(RequestError::Backend(BackendError::Io));
                (S_IOERR, 0)
            }
            (Ok(_), Kind::Write) => {
                self.counters.bytes_written += u64::from(r.data_len);
                (S_OK, 0)
            }
            (Ok(_), Kind::Flush) => (S_OK, 0),
            (Err(e), _) => {
                self.counters.io_errors += 1;
                self.counters.backend_errors += 1;
                self.note(RequestError::Backend(*e));
                (S_IOERR, 0)
            }
        }
    }
}
