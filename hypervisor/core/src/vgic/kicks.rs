//! [`Kicks`], the set of vCPUs the caller must wake or interrupt after a
//! call that may have made an interrupt deliverable, and [`MAX_VCPUS`], the
//! most vCPUs one vGIC serves (the size of that set). Depends on nothing
//! else in the vGIC, so the vITS and the EL2 code use it freely.

use core::fmt;

/// The most vCPUs one vGIC serves (size of [`Kicks`]).
pub const MAX_VCPUS: usize = 256;

/// A set of vCPUs that the caller must wake or interrupt.
#[derive(Clone, Copy, Default, PartialEq, Eq)]
pub struct Kicks {
    bits: [u64; MAX_VCPUS / 64],
}

impl Kicks {
    /// The empty set.
    pub const fn none() -> Self {
        Kicks { bits: [0; MAX_VCPUS / 64] }
    }
    /// Adds `vcpu` (ignored when ≥ [`MAX_VCPUS`]).
    pub fn add(&mut self, vcpu: usize) {
        if let Some(w) = self.bits.get_mut(vcpu / 64) {
            *w |= 1 << (vcpu % 64);
        }
    }
    /// Whether `vcpu` is in the set.
    pub fn contains(&self, vcpu: usize) -> bool {
        self.bits.get(vcpu / 64).is_some_and(|w| w & (1 << (vcpu % 64)) != 0)
    }
    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.bits.iter().all(|&w| w == 0)
    }
    /// Adds every member of `other`.
    pub fn merge(&mut self, other: Kicks) {
        for (a, b) in self.bits.iter_mut().zip(other.bits) {
            *a |= b;
        }
    }
    /// The members, in increasing order.
    pub fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        (0..MAX_VCPUS).filter(move |&v| self.contains(v))
    }
}

impl fmt::Debug for Kicks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.iter()).finish()
    }
}
