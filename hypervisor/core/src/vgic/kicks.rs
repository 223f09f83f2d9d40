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
    /// The members, in increasing order. Visits set bits only (one
    /// trailing-zero count each): the set is on every injection's path, and
    /// testing all [`MAX_VCPUS`] positions cost ~1 500 instructions per
    /// SGI to a vCPU's own pCPU.
    pub fn iter(&self) -> KicksIter {
        let words = self.bits.iter().enumerate().fold(0u8, |m, (i, &w)| m | u8::from(w != 0) << i);
        KicksIter { bits: self.bits, words }
    }
}

// `KicksIter::words` has a bit per word.
const _: () = assert!(MAX_VCPUS / 64 <= 8);

/// The members of a [`Kicks`] (a copy: the set is 32 bytes), lowest first.
#[derive(Clone, Debug)]
pub struct KicksIter {
    bits: [u64; MAX_VCPUS / 64],
    /// One bit per word of `bits` not visited to its end: the empty words
    /// of a set of a few vCPUs are never loaded.
    words: u8,
}

impl Iterator for KicksIter {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        while self.words != 0 {
            let word = self.words.trailing_zeros() as usize;
            match self.bits.get_mut(word) {
                Some(w) if *w != 0 => {
                    let bit = w.trailing_zeros() as usize;
                    *w &= *w - 1;
                    if *w == 0 {
                        self.words &= !(1 << word);
                    }
                    return Some(word * 64 + bit);
                }
                _ => self.words &= !(1 << word),
            }
        }
        None
    }
}

impl fmt::Debug for Kicks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec::Vec;

    #[test]
    fn iter_yields_every_member_once_in_order() {
        assert_eq!(Kicks::none().iter().next(), None);
        let members = [0, 1, 63, 64, 65, 127, 128, 200, MAX_VCPUS - 1];
        let mut k = Kicks::none();
        for &m in members.iter().rev() {
            k.add(m);
        }
        k.add(MAX_VCPUS); // out of range: ignored
        assert_eq!(k.iter().collect::<Vec<_>>(), members);
        // Every single member, and the positions tested one by one agree.
        let mut rng = crate::testrng::Rng(7);
        for _ in 0..200 {
            let mut k = Kicks::none();
            for _ in 0..rng.below(20) {
                k.add(rng.index(MAX_VCPUS));
            }
            let want: Vec<usize> = (0..MAX_VCPUS).filter(|&v| k.contains(v)).collect();
            assert_eq!(k.iter().collect::<Vec<_>>(), want);
        }
    }
}
