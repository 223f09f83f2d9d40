//! A deterministic pseudo-random generator for the host tests that throw
//! random or corrupted inputs at parsers and planners (xorshift64*: no
//! dependency, the same sequence on every run).

pub struct Rng(pub u64);

impl Rng {
    // Not an Iterator: the sequence never ends, and the tests call `next`
    // beside `below` on the same generator.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform-ish in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// An index in `0..n` (`n` > 0).
    pub fn index(&mut self, n: usize) -> usize {
        self.below(n as u64) as usize
    }
}
