//! Taking requests off a queue: [`VirtioBlk::process_queue`] admits each
//! chain against the budgets (queue size, request count, backend slots,
//! in-flight bytes, the VM's quota) before anything is allocated for it,
//! then `handle_request` parses and validates it (header, direction,
//! length, sector range, guest RAM) and either answers it at once or hands
//! it to the backend with a fresh token, recorded as [`InFlight`].

use super::super::buf::DataBuf;
use super::super::mmio::Effects;
use super::super::queue::Segment;
use super::super::{features, GuestMemory, MemError};
use super::backend::{BackendError, BackendOp, BackendRequest, BlockBackend};
use super::config::{HEADER_LEN, ID_BYTES, SECTOR_SIZE, S_OK, S_UNSUPP, T_FLUSH, T_GET_ID, T_IN, T_OUT};
use super::cost::request_cost;
use super::error::RequestError;
use super::stream::{gather, gather_buf, scatter, stream_len};
use super::{InFlight, Kind, VirtioBlk};
use alloc::vec::Vec;

impl VirtioBlk {
    /// Consume the chains the driver made available on queue `q`: parse each
    /// request, hand it to `backend`, or answer it at once. `now_ns` is
    /// passed to the backend as the submit time. Reads the avail index once:
    /// chains added during the call wait for the driver's next notify.
    pub fn process_queue(
        &mut self,
        q: u16,
        mem: &mut dyn GuestMemory,
        backend: &mut dyn BlockBackend,
        now_ns: u64,
    ) -> Effects {
        let mut fx = Effects::default();
        let qi = usize::from(q);
        if !self.transport.live() || qi >= self.transport.queues.len() || !self.transport.queues[qi].ready {
            return fx;
        }
        self.stalled[qi] = false;
        let pending = match self.transport.queues[qi].pending(mem) {
            Ok(n) => n,
            Err(e) => return self.fail_device(Some(e)),
        };
        let size = usize::from(self.transport.queues[qi].size);
        for _ in 0..pending {
            if self.transport.needs_reset() {
                break;
            }
            // Live requests (the device has one queue) against the queue
            // size; everything held, orphans included, against the budget.
            let held = self.in_flight.len();
            if held - self.orphans >= size || held >= self.cfg.max_in_flight_requests || backend.free_slots() == 0 {
                self.stalled[qi] = true;
                self.counters.stalls += 1;
                break;
            }
            let head = match self.transport.queues[qi].peek_head(mem) {
                Ok(h) => h,
                Err(e) => {
                    fx.merge(self.fail_device(Some(e)));
                    break;
                }
            };
            let indirect = self.transport.negotiated() & features::RING_INDIRECT_DESC != 0;
            let mut segs = core::mem::take(&mut self.segs);
            let walked = self.transport.queues[qi].walk_chain(mem, head, indirect, &mut segs);
            // Byte budget: a request's data is at most its chain's length.
            let bytes: u64 = segs.iter().map(|s| u64::from(s.len)).sum();
            if walked.is_ok() && held > 0 && self.in_flight_bytes + bytes > self.cfg.max_in_flight_bytes {
                self.segs = segs;
                self.stalled[qi] = true;
                self.counters.stalls += 1;
                break;
            }
            // The VM's quota, charged for the request before anything is
            // allocated for it; given back when it is answered.
            let cost = request_cost(bytes, segs.len(), self.cfg.max_request_bytes);
            if walked.is_ok() && !self.hold(cost) {
                self.segs = segs;
                self.stalled[qi] = true;
                self.counters.stalls += 1;
                self.counters.quota_stalls += 1;
                break;
            }
            self.transport.queues[qi].advance();
            let e = match walked {
                Err(e) => self.unanswerable(mem, q, head, RequestError::Chain(e)),
                Ok(()) => match self.handle_request(q, head, &segs, mem, backend, now_ns, cost) {
                    // The backend holds it, and its charge.
                    None => Effects::default(),
                    // Answered at once: its charge comes back.
                    Some(fx) => {
                        self.unhold(cost);
                        fx
                    }
                },
            };
            fx.merge(e);
            segs.clear();
            self.segs = segs;
        }
        self.update_in_flight();
        fx
    }

    /// Answers the request at once (`Some`: the effects of answering it) or
    /// hands it to the backend, which then holds `cost` (`None`).
    #[allow(clippy::too_many_arguments)]
    fn handle_request(
        &mut self,
        q: u16,
        head: u16,
        segs: &[Segment],
        mem: &mut dyn GuestMemory,
        backend: &mut dyn BlockBackend,
        now_ns: u64,
        cost: u64,
    ) -> Option<Effects> {
        // The status byte: the last byte of the writable stream.
        let Some(last) = segs.iter().rev().find(|s| s.writable && s.len > 0) else {
            return Some(self.unanswerable(mem, q, head, RequestError::NoStatus));
        };
        let status_gpa = match last.addr.checked_add(u64::from(last.len) - 1) {
            Some(a) if mem.contains(a, 1) => a,
            a => {
                let e = RequestError::StatusOutsideRam(a.unwrap_or(u64::MAX));
                return Some(self.unanswerable(mem, q, head, e));
            }
        };
        let readable = stream_len(segs, false);
        let writable_data = stream_len(segs, true) - 1;

        let mut hdr = [0u8; HEADER_LEN as usize];
        if readable < HEADER_LEN {
            return Some(self.reject(mem, q, head, status_gpa, RequestError::ShortHeader));
        }
        if let Err(e) = gather(mem, segs, 0, &mut hdr) {
            return Some(self.reject(mem, q, head, status_gpa, RequestError::Mem(e)));
        }
        let ty = u32::from_le_bytes([hdr[0], hdr[1], hdr[2], hdr[3]]);
        let sector = u64::from_le_bytes([hdr[8], hdr[9], hdr[10], hdr[11], hdr[12], hdr[13], hdr[14], hdr[15]]);

        let (kind, op, data_len) = match ty {
            T_IN => {
                if readable != HEADER_LEN {
                    return Some(self.reject(mem, q, head, status_gpa, RequestError::WrongDirection));
                }
                if let Err(e) = self.check_range(sector, writable_data) {
                    return Some(self.reject(mem, q, head, status_gpa, e));
                }
                if let Some(s) = segs.iter().find(|s| s.writable && !mem.contains(s.addr, u64::from(s.len))) {
                    let e = MemError::OutOfRange { gpa: s.addr, len: u64::from(s.len) };
                    return Some(self.reject(mem, q, head, status_gpa, RequestError::Mem(e)));
                }
                (Kind::Read, BackendOp::Read { sector, len: writable_data as u32 }, writable_data as u32)
            }
            T_OUT => {
                let len = readable - HEADER_LEN;
                if writable_data != 0 {
                    return Some(self.reject(mem, q, head, status_gpa, RequestError::WrongDirection));
                }
                if self.cfg.read_only {
                    return Some(self.reject(mem, q, head, status_gpa, RequestError::ReadOnly));
                }
                if let Err(e) = self.check_range(sector, len) {
                    return Some(self.reject(mem, q, head, status_gpa, e));
                }
                // Copy the data now: the guest cannot change it afterwards.
                let Ok(mut data) = DataBuf::try_zeroed(len as usize) else {
                    return Some(self.reject(mem, q, head, status_gpa, RequestError::Backend(BackendError::NoMemory)));
                };
                if let Err(e) = gather_buf(mem, segs, HEADER_LEN, &mut data) {
                    return Some(self.reject(mem, q, head, status_gpa, RequestError::Mem(e)));
                }
                (Kind::Write, BackendOp::Write { sector, data }, len as u32)
            }
            T_FLUSH => (Kind::Flush, BackendOp::Flush, 0),
            T_GET_ID => {
                self.counters.get_ids += 1;
                let n = (writable_data as usize).min(ID_BYTES);
                let serial = self.cfg.serial;
                if let Err(e) = scatter(mem, segs, 0, &serial[..n]) {
                    return Some(self.reject(mem, q, head, status_gpa, RequestError::Mem(e)));
                }
                return Some(self.answer(mem, q, head, status_gpa, S_OK, n as u32));
            }
            other => {
                self.counters.unsupported += 1;
                self.note(RequestError::Unsupported(other));
                return Some(self.answer(mem, q, head, status_gpa, S_UNSUPP, 0));
            }
        };

        // Where read data goes at completion, kept before the backend has
        // the request so no allocation can fail after it does.
        let mut wsegs = Vec::new();
        if kind == Kind::Read {
            if wsegs.try_reserve_exact(segs.len()).is_err() {
                return Some(self.reject(mem, q, head, status_gpa, RequestError::Backend(BackendError::NoMemory)));
            }
            wsegs.extend(segs.iter().filter(|s| s.writable).copied());
        }
        let token = self.next_token;
        self.next_token = self.next_token.wrapping_add(1);
        match backend.submit(BackendRequest { token, op, submit_ns: now_ns }) {
            Ok(()) => {
                match kind {
                    Kind::Read => self.counters.reads += 1,
                    Kind::Write => self.counters.writes += 1,
                    Kind::Flush => self.counters.flushes += 1,
                }
                let r = InFlight { queue: q, head, kind, wsegs, data_len, status_gpa, orphaned: false, cost };
                self.in_flight.insert(token, r);
                self.in_flight_bytes += u64::from(data_len);
                self.update_in_flight();
                None
            }
            Err(e) => {
                self.counters.backend_errors += 1;
                Some(self.reject(mem, q, head, status_gpa, RequestError::Backend(e)))
            }
        }
    }

    /// IOERR for data length `len` at `sector`.
    fn check_range(&self, sector: u64, len: u64) -> Result<(), RequestError> {
        if len == 0 {
            return Err(RequestError::Empty);
        }
        if !len.is_multiple_of(SECTOR_SIZE) {
            return Err(RequestError::Misaligned(len));
        }
        if len > u64::from(self.cfg.max_request_bytes) {
            return Err(RequestError::TooLarge(len));
        }
        match sector.checked_add(len / SECTOR_SIZE) {
            Some(end) if end <= self.cfg.capacity_sectors => Ok(()),
            _ => Err(RequestError::PastEnd { sector, len }),
        }
    }
}
