//! The vITS backend of a VM on the GICv4 path: the guest's ITS commands
//! become physical ITS commands on its vPEs, planned by `its::v4` and sent
//! through any [`VlpiIts`] (the EL2 driver, or a fake ITS in the host tests).

use super::{BackendError, ItsBackend};
use crate::intid::IntId;
use crate::its::host::ItsError;
use crate::its::v4::{GuestChange, VlpiIts, VpeMap};

/// Why the physical ITS refused, as the vITS model counts it.
pub fn backend_error(what: &str, device: u32, e: ItsError) -> BackendError {
    log::warn!("vITS (GICv4): physical ITS refused {what} for DeviceID {device:#x}: {e}");
    match e {
        ItsError::NoFreeLpi | ItsError::OutOfMemory => BackendError::NoResources,
        ItsError::DeviceOutOfRange(d) => BackendError::BadDevice(d),
        _ => BackendError::Hardware,
    }
}

/// The vITS backend of a VM on the GICv4 path: each guest mapping change
/// becomes a [`GuestChange`] for its vPEs. Guest MAPD → MAPD; MAPTI/MAPI →
/// VMAPTI/VMAPI; MOVI → VMOVI; DISCARD → DISCARD; INV → INV and INVALL →
/// VINVALL (the redistributor re-reads the guest's configuration table);
/// INT → INT (pending in the virtual pending table, not in a list
/// register); CLEAR → CLEAR.
pub struct DirectBackend<'a, I: VlpiIts> {
    pub its: I,
    pub vpes: &'a VpeMap,
}

impl<I: VlpiIts> DirectBackend<'_, I> {
    fn change(&mut self, what: &str, device: u32, c: GuestChange) -> Result<(), BackendError> {
        self.its.change(c, self.vpes).map_err(|e| backend_error(what, device, e))
    }
}

impl<I: VlpiIts> ItsBackend for DirectBackend<'_, I> {
    fn map_device(&mut self, device: u32, event_bits: u8) -> Result<(), BackendError> {
        self.its.map_device(device, event_bits).map_err(|e| backend_error("MAPD", device, e))
    }

    fn unmap_device(&mut self, device: u32) {
        if let Err(e) = self.its.unmap_device(device) {
            backend_error("MAPD V=0", device, e);
        }
    }

    fn map_event(&mut self, device: u32, event: u32, vintid: IntId, vcpu: Option<usize>) -> Result<(), BackendError> {
        self.change("VMAPTI", device, GuestChange::Map { device, event, vintid: u32::from(vintid), vcpu })
    }

    fn unmap_event(&mut self, device: u32, event: u32) {
        let _ = self.change("DISCARD", device, GuestChange::Unmap { device, event, vcpu: None });
    }

    fn move_event(&mut self, device: u32, event: u32, vcpu: Option<usize>) {
        let _ = self.change("VMOVI", device, GuestChange::Move { device, event, from: None, to: vcpu });
    }

    fn inv_event(&mut self, device: u32, event: u32, vcpu: usize) {
        let _ = self.change("INV", device, GuestChange::Inv { device, event, vcpu: Some(vcpu) });
    }

    fn invall(&mut self, vcpu: usize) {
        let _ = self.change("VINVALL", 0, GuestChange::Invall { vcpu });
    }

    fn int_event(&mut self, device: u32, event: u32, vcpu: usize) -> bool {
        self.change("INT", device, GuestChange::Int { device, event, vcpu: Some(vcpu) }).is_ok()
    }

    fn clear_event(&mut self, device: u32, event: u32, vcpu: usize) {
        let _ = self.change("CLEAR", device, GuestChange::Clear { device, event, vcpu: Some(vcpu) });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::its::cmd::Command as C;
    use crate::its::host::Mappings;
    use crate::its::v4::tests::two_vpes;
    use crate::its::v4::{check_and_plan, record};
    use alloc::vec::Vec;

    /// A physical ITS that keeps the driver's bookkeeping and records the
    /// commands it would send.
    struct FakeIts {
        map: Mappings,
        sent: Vec<C>,
    }

    impl VlpiIts for FakeIts {
        fn map_device(&mut self, device: u32, event_bits: u8) -> Result<(), ItsError> {
            self.map.check_new_device(device, event_bits)?;
            self.sent.push(C::Mapd { device, size: event_bits - 1, itt_addr: 0x1000, valid: true });
            self.map.add_device(device, event_bits, 0x1000, 256)
        }
        fn unmap_device(&mut self, device: u32) -> Result<(), ItsError> {
            for event in self.map.vevents_of(device) {
                self.sent.push(C::Discard { device, event });
            }
            self.sent.push(C::Mapd { device, size: 0, itt_addr: 0, valid: false });
            self.map.remove_device(device).map(|_| ())
        }
        fn change(&mut self, c: GuestChange, vpes: &VpeMap) -> Result<(), ItsError> {
            let cmds = check_and_plan(&self.map, c, vpes)?;
            self.sent.extend_from_slice(&cmds);
            record(&mut self.map, c, vpes)
        }
    }

    fn vintid(n: u32) -> IntId {
        IntId::lpi(n).unwrap()
    }

    #[test]
    fn the_backend_turns_linux_mapping_sequence_into_v_commands_and_refuses_what_is_not_this_vms() {
        let vpes = two_vpes();
        let mut b = DirectBackend { its: FakeIts { map: Mappings::new(16, 15, 1), sent: Vec::new() }, vpes: &vpes };
        // Linux: MAPD, MAPTI per vector (INV follows on unmask), MOVI on
        // affinity change, INT on retrigger, DISCARD and MAPD V=0 on free.
        b.map_device(8, 2).unwrap();
        b.map_event(8, 0, vintid(0), Some(0)).unwrap();
        b.map_event(8, 1, vintid(1), Some(1)).unwrap();
        b.inv_event(8, 1, 1);
        b.move_event(8, 1, Some(0));
        assert!(b.int_event(8, 1, 0), "INT goes into hardware");
        b.clear_event(8, 1, 0);
        b.invall(1);
        b.unmap_event(8, 0);
        b.unmap_device(8);
        assert_eq!(
            b.its.sent,
            [
                C::Mapd { device: 8, size: 1, itt_addr: 0x1000, valid: true },
                C::Vmapti { device: 8, event: 0, vpe: 0, vintid: 8192, doorbell: 8200 },
                C::Vsync { vpe: 0 },
                C::Vmapti { device: 8, event: 1, vpe: 1, vintid: 8193, doorbell: 8201 },
                C::Vsync { vpe: 1 },
                C::Inv { device: 8, event: 1 },
                C::Vsync { vpe: 1 },
                C::Vmovi { device: 8, event: 1, vpe: 0, set_doorbell: true, doorbell: 8200 },
                C::Vsync { vpe: 1 },
                C::Vsync { vpe: 0 },
                C::Int { device: 8, event: 1 },
                C::Vsync { vpe: 0 },
                C::Clear { device: 8, event: 1 },
                C::Vsync { vpe: 0 },
                C::Vinvall { vpe: 1 },
                C::Vsync { vpe: 1 },
                C::Discard { device: 8, event: 0 },
                C::Vsync { vpe: 0 },
                C::Discard { device: 8, event: 1 },
                C::Mapd { device: 8, size: 0, itt_addr: 0, valid: false },
            ]
        );
        // Bad input reaches no hardware: a vCPU the VM lacks, an event
        // mapped twice or beyond the ITT, changes of unmapped events, an
        // unknown device.
        b.its.sent.clear();
        b.map_device(9, 1).unwrap();
        b.its.sent.clear();
        assert_eq!(b.map_event(9, 0, vintid(0), Some(2)), Err(BackendError::Hardware));
        b.map_event(9, 0, vintid(0), Some(1)).unwrap();
        assert_eq!(b.map_event(9, 0, vintid(1), Some(1)), Err(BackendError::Hardware));
        assert_eq!(b.map_event(9, 2, vintid(2), Some(1)), Err(BackendError::Hardware));
        assert_eq!(b.map_event(7, 0, vintid(2), Some(1)), Err(BackendError::Hardware));
        b.sent_only_vmapti_so_far();
        b.inv_event(9, 1, 0);
        b.move_event(9, 1, Some(0));
        assert!(!b.int_event(9, 1, 0), "an unmapped event: the vGIC path decides");
        b.unmap_event(9, 1);
        b.invall(4);
        b.sent_only_vmapti_so_far();
        assert_eq!(b.its.map.vevent(9, 0), Ok(crate::its::host::VEventMap { vpe: 1, vintid: 8192 }));
    }

    impl DirectBackend<'_, FakeIts> {
        fn sent_only_vmapti_so_far(&self) {
            assert_eq!(
                self.its.sent,
                [C::Vmapti { device: 9, event: 0, vpe: 1, vintid: 8192, doorbell: 8201 }, C::Vsync { vpe: 1 }]
            );
        }
    }
}
