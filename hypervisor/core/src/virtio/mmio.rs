//! The virtio-mmio transport, version 2 (virtio 1.2 §4.2.2), device side.
//!
//! A 0x200-byte register frame, like each of QEMU's virtio-mmio slots:
//! 32-bit registers from 0x000 to 0x0fc (only aligned 32-bit accesses are
//! valid there; anything else is a [`MmioError`] and the EL2 code injects an
//! abort), and the device-specific configuration space from 0x100 (any of
//! 8/16/32/64-bit accesses, bytes past the structure read as zero, writes
//! ignored: the block device has no writable config field we offer).
//!
//! Reads of write-only registers return 0 and writes to read-only registers
//! are ignored, as QEMU does. Writes to a queue's setup registers while that
//! queue is ready are ignored (§4.2.3.2 forbids them).
//!
//! The status handshake: writing 0 resets the device; FEATURES_OK is kept
//! only if the driver accepted VERSION_1 and nothing the device did not offer
//! (the driver reads Status back to find out); DEVICE_NEEDS_RESET is owned by
//! the device and sticks until reset. Driver feature writes after FEATURES_OK
//! are ignored.

use super::queue::{QueueError, SplitQueue};
use super::{features, irq, status, GuestMemory};
use alloc::vec::Vec;

pub const MAGIC_VALUE: u64 = 0x000;
pub const VERSION: u64 = 0x004;
pub const DEVICE_ID: u64 = 0x008;
pub const VENDOR_ID: u64 = 0x00c;
pub const DEVICE_FEATURES: u64 = 0x010;
pub const DEVICE_FEATURES_SEL: u64 = 0x014;
pub const DRIVER_FEATURES: u64 = 0x020;
pub const DRIVER_FEATURES_SEL: u64 = 0x024;
pub const QUEUE_SEL: u64 = 0x030;
pub const QUEUE_NUM_MAX: u64 = 0x034;
pub const QUEUE_NUM: u64 = 0x038;
pub const QUEUE_READY: u64 = 0x044;
pub const QUEUE_NOTIFY: u64 = 0x050;
pub const INTERRUPT_STATUS: u64 = 0x060;
pub const INTERRUPT_ACK: u64 = 0x064;
pub const STATUS: u64 = 0x070;
pub const QUEUE_DESC_LOW: u64 = 0x080;
pub const QUEUE_DESC_HIGH: u64 = 0x084;
pub const QUEUE_DRIVER_LOW: u64 = 0x090;
pub const QUEUE_DRIVER_HIGH: u64 = 0x094;
pub const QUEUE_DEVICE_LOW: u64 = 0x0a0;
pub const QUEUE_DEVICE_HIGH: u64 = 0x0a4;
pub const SHM_SEL: u64 = 0x0ac;
pub const SHM_LEN_LOW: u64 = 0x0b0;
pub const SHM_LEN_HIGH: u64 = 0x0b4;
pub const SHM_BASE_LOW: u64 = 0x0b8;
pub const SHM_BASE_HIGH: u64 = 0x0bc;
pub const CONFIG_GENERATION: u64 = 0x0fc;
pub const CONFIG: u64 = 0x100;
/// Size of the register frame (one QEMU virtio-mmio slot).
pub const FRAME_SIZE: u64 = 0x200;

/// "virt" in little endian.
pub const MAGIC: u32 = 0x7472_6976;

/// A guest access the transport does not accept.
#[derive(thiserror::Error, Clone, Copy, Debug, PartialEq, Eq)]
pub enum MmioError {
    /// Registers take aligned 32-bit accesses; config space 1, 2, 4 or 8 bytes.
    #[error("virtio-mmio access of {size} bytes at {offset:#x}")]
    BadAccessSize { offset: u64, size: u8 },
    /// A register access not aligned to 4 bytes.
    #[error("virtio-mmio register access at {offset:#x} not 4-byte aligned")]
    Misaligned { offset: u64 },
    /// Outside the 0x200-byte frame (or a config access crossing its end).
    #[error("virtio-mmio access at {offset:#x} outside the frame")]
    OutOfRange { offset: u64 },
}

/// What the EL2 caller must do after a device call.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[must_use]
pub struct Effects {
    /// Process this queue now ([`super::VirtioBlk::process_queue`]): the
    /// guest notified it, or a completion freed room for requests the
    /// device had to leave in the ring.
    pub notify: Option<u16>,
    /// The interrupt line changed: mirror [`super::VirtioBlk::irq_level`]
    /// into the vGIC.
    pub irq_level_changed: bool,
}

impl Effects {
    pub(crate) fn merge(&mut self, o: Effects) {
        self.notify = self.notify.or(o.notify);
        self.irq_level_changed |= o.irq_level_changed;
    }
}

/// What a register write meant, for the device layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Event {
    None,
    /// The driver wrote Status = 0.
    Reset,
    /// QueueReady 1 → 0 for this queue.
    QueueDisabled(u16),
    /// QueueReady was refused (device now needs reset).
    QueueRejected(u16, QueueError),
}

/// The transport's state: everything a reset clears.
#[derive(Clone, Debug)]
pub struct MmioTransport {
    device_id: u32,
    vendor_id: u32,
    device_features: u64,
    driver_features: u64,
    device_features_sel: u32,
    driver_features_sel: u32,
    queue_sel: u32,
    queue_max: u16,
    pub(crate) queues: Vec<SplitQueue>,
    status: u32,
    interrupt_status: u32,
    config_generation: u32,
}

impl MmioTransport {
    pub fn new(device_id: u32, vendor_id: u32, device_features: u64, nr_queues: usize, queue_max: u16) -> Self {
        Self {
            device_id,
            vendor_id,
            device_features,
            driver_features: 0,
            device_features_sel: 0,
            driver_features_sel: 0,
            queue_sel: 0,
            queue_max,
            queues: (0..nr_queues).map(|_| SplitQueue::new(queue_max)).collect(),
            status: 0,
            interrupt_status: 0,
            config_generation: 0,
        }
    }

    fn reset(&mut self) {
        self.driver_features = 0;
        self.device_features_sel = 0;
        self.driver_features_sel = 0;
        self.queue_sel = 0;
        for q in &mut self.queues {
            *q = SplitQueue::new(self.queue_max);
        }
        self.status = 0;
        self.interrupt_status = 0;
    }

    pub fn status(&self) -> u32 {
        self.status
    }

    pub fn device_features(&self) -> u64 {
        self.device_features
    }

    /// Features in force: what the driver accepted, once FEATURES_OK stuck.
    pub fn negotiated(&self) -> u64 {
        if self.status & status::FEATURES_OK != 0 {
            self.driver_features
        } else {
            0
        }
    }

    /// The device may consume buffers and send used-buffer notifications.
    pub fn live(&self) -> bool {
        self.status & status::DRIVER_OK != 0
            && self.status & (status::DEVICE_NEEDS_RESET | status::FAILED) == 0
            && self.status & status::FEATURES_OK != 0
    }

    pub fn interrupt_status(&self) -> u32 {
        self.interrupt_status
    }

    pub fn irq_level(&self) -> bool {
        self.interrupt_status != 0
    }

    /// Set InterruptStatus bits; true if the line level changed.
    pub fn raise(&mut self, bits: u32) -> bool {
        let was = self.irq_level();
        self.interrupt_status |= bits;
        was != self.irq_level()
    }

    /// Enter DEVICE_NEEDS_RESET and send a configuration change
    /// notification (§2.1.2); true if the line level changed. Only once the
    /// driver is past ACKNOWLEDGE does the status bit mean anything.
    pub fn set_needs_reset(&mut self) -> bool {
        self.status |= status::DEVICE_NEEDS_RESET;
        self.raise(irq::CONFIG)
    }

    pub fn needs_reset(&self) -> bool {
        self.status & status::DEVICE_NEEDS_RESET != 0
    }

    fn sel_queue(&self) -> Option<usize> {
        let i = self.queue_sel as usize;
        (i < self.queues.len()).then_some(i)
    }

    fn check(offset: u64, size: u8) -> Result<(), MmioError> {
        if offset >= FRAME_SIZE {
            return Err(MmioError::OutOfRange { offset });
        }
        if offset >= CONFIG {
            if !matches!(size, 1 | 2 | 4 | 8) {
                return Err(MmioError::BadAccessSize { offset, size });
            }
            if offset + u64::from(size) > FRAME_SIZE {
                return Err(MmioError::OutOfRange { offset });
            }
            return Ok(());
        }
        if size != 4 {
            return Err(MmioError::BadAccessSize { offset, size });
        }
        if !offset.is_multiple_of(4) {
            return Err(MmioError::Misaligned { offset });
        }
        Ok(())
    }

    /// A guest read at `offset` in the frame; `config` is the device's
    /// configuration structure (little endian).
    pub fn read(&self, offset: u64, size: u8, config: &[u8]) -> Result<u64, MmioError> {
        Self::check(offset, size)?;
        if offset >= CONFIG {
            let start = (offset - CONFIG) as usize;
            let mut v: u64 = 0;
            for i in 0..usize::from(size) {
                let b = config.get(start + i).copied().unwrap_or(0);
                v |= u64::from(b) << (8 * i);
            }
            return Ok(v);
        }
        let q = self.sel_queue().map(|i| &self.queues[i]);
        let v: u32 = match offset {
            MAGIC_VALUE => MAGIC,
            VERSION => 2,
            DEVICE_ID => self.device_id,
            VENDOR_ID => self.vendor_id,
            DEVICE_FEATURES => match self.device_features_sel {
                0 => self.device_features as u32,
                1 => (self.device_features >> 32) as u32,
                _ => 0,
            },
            QUEUE_NUM_MAX => q.map_or(0, |_| u32::from(self.queue_max)),
            QUEUE_READY => q.map_or(0, |q| u32::from(q.ready)),
            INTERRUPT_STATUS => self.interrupt_status,
            STATUS => self.status,
            // No shared memory regions: length and base read as all ones.
            SHM_LEN_LOW | SHM_LEN_HIGH | SHM_BASE_LOW | SHM_BASE_HIGH => u32::MAX,
            CONFIG_GENERATION => self.config_generation,
            _ => 0,
        };
        Ok(u64::from(v))
    }

    /// A guest write; returns the effects for the caller and the event for
    /// the device layer.
    pub(crate) fn write(
        &mut self,
        offset: u64,
        size: u8,
        value: u64,
        mem: &dyn GuestMemory,
    ) -> Result<(Effects, Event), MmioError> {
        Self::check(offset, size)?;
        let mut fx = Effects::default();
        if offset >= CONFIG {
            return Ok((fx, Event::None));
        }
        let v = value as u32;
        let mut ev = Event::None;
        let qi = self.sel_queue();
        // Setup registers of the selected queue: only while it is not ready.
        let setup = qi.filter(|&i| !self.queues[i].ready);
        match offset {
            DEVICE_FEATURES_SEL => self.device_features_sel = v,
            DRIVER_FEATURES_SEL => self.driver_features_sel = v,
            // Ignored once FEATURES_OK stuck: features are fixed from then on.
            DRIVER_FEATURES if self.status & status::FEATURES_OK == 0 => match self.driver_features_sel {
                0 => self.driver_features = (self.driver_features & !0xffff_ffff) | u64::from(v),
                1 => self.driver_features = (self.driver_features & 0xffff_ffff) | (u64::from(v) << 32),
                _ => {}
            },
            QUEUE_SEL => self.queue_sel = v,
            QUEUE_NUM => {
                if let Some(i) = setup {
                    // Checked at QueueReady; keep what fits in u16 (a larger
                    // value becomes an invalid size there, not a truncation).
                    self.queues[i].size = u16::try_from(v).unwrap_or(0);
                }
            }
            QUEUE_DESC_LOW | QUEUE_DESC_HIGH | QUEUE_DRIVER_LOW | QUEUE_DRIVER_HIGH | QUEUE_DEVICE_LOW
            | QUEUE_DEVICE_HIGH => {
                if let Some(i) = setup {
                    let q = &mut self.queues[i];
                    let (field, high) = match offset {
                        QUEUE_DESC_LOW => (&mut q.desc, false),
                        QUEUE_DESC_HIGH => (&mut q.desc, true),
                        QUEUE_DRIVER_LOW => (&mut q.driver, false),
                        QUEUE_DRIVER_HIGH => (&mut q.driver, true),
                        QUEUE_DEVICE_LOW => (&mut q.device, false),
                        _ => (&mut q.device, true),
                    };
                    *field = if high {
                        (*field & 0xffff_ffff) | (u64::from(v) << 32)
                    } else {
                        (*field & !0xffff_ffff) | u64::from(v)
                    };
                }
            }
            QUEUE_READY => {
                if let Some(i) = qi {
                    let q = &mut self.queues[i];
                    if v & 1 == 0 && q.ready {
                        q.ready = false;
                        ev = Event::QueueDisabled(i as u16);
                    } else if v & 1 == 1 && !q.ready {
                        match q.validate(self.queue_max, mem) {
                            Ok(()) => q.activate(),
                            Err(e) => {
                                fx.irq_level_changed |= self.set_needs_reset();
                                ev = Event::QueueRejected(i as u16, e);
                            }
                        }
                    }
                }
            }
            QUEUE_NOTIFY => {
                let i = v as usize;
                if i < self.queues.len() && self.queues[i].ready {
                    fx.notify = Some(i as u16);
                }
            }
            INTERRUPT_ACK => {
                let was = self.irq_level();
                self.interrupt_status &= !v;
                fx.irq_level_changed |= was != self.irq_level();
            }
            STATUS => {
                if v & 0xff == 0 {
                    let was = self.irq_level();
                    self.reset();
                    fx.irq_level_changed |= was != self.irq_level();
                    ev = Event::Reset;
                } else {
                    let mut s = (v & 0xff) & !status::DEVICE_NEEDS_RESET;
                    if s & status::FEATURES_OK != 0 && self.status & status::FEATURES_OK == 0 {
                        let bad = self.driver_features & !self.device_features;
                        if bad != 0 || self.driver_features & features::VERSION_1 == 0 {
                            s &= !status::FEATURES_OK;
                        }
                    }
                    self.status = s | (self.status & status::DEVICE_NEEDS_RESET);
                }
            }
            SHM_SEL => {}
            _ => {}
        }
        Ok((fx, ev))
    }
}
