//! Physical address ranges: the one range type of the machine description,
//! the boot plan, stage 2 and the device models.

/// A physical address range.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Region {
    pub base: u64,
    pub size: u64,
}

impl Region {
    /// One past the last byte (saturating).
    pub fn end(&self) -> u64 {
        self.base.saturating_add(self.size)
    }
}
