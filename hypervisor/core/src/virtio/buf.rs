//! Request data held by the hypervisor: [`DataBuf`].
//!
//! A request's data lives on the heap from submit (write data copied out of
//! the guest) or from the backend's completion (read data) until it is
//! copied into the guest or reaches the disk. The heap is a buddy allocator:
//! one block of 2 MiB + 512 bytes would take 4 MiB. So a buffer is the
//! binary decomposition of its length, one power-of-two chunk per set bit,
//! largest first: the allocator takes exactly the length (plus the small
//! chunk list), which is what the VM's quota is charged ([`DataBuf::cost`]).
//! A 4 MiB request has at most 14 chunks of 512 bytes or more.
//!
//! Every allocation is fallible: a buffer that cannot be had is an error the
//! caller turns into back-pressure or IOERR.

use crate::quota::heap_cost;
use alloc::vec::Vec;
use core::fmt;

/// The heap had no room for a buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NoMemory;

/// Chunks of a buffer of `len` bytes: one per set bit.
fn nr_chunks(len: usize) -> usize {
    len.count_ones() as usize
}

/// Bytes of data in flight as the buddy allocator holds them.
#[derive(Clone, Default)]
pub struct DataBuf {
    /// Power-of-two lengths, strictly decreasing.
    chunks: Vec<Vec<u8>>,
    len: usize,
}

impl DataBuf {
    /// An empty buffer (no allocation).
    pub const fn new() -> Self {
        DataBuf { chunks: Vec::new(), len: 0 }
    }

    /// `len` zero bytes.
    pub fn try_zeroed(len: usize) -> Result<Self, NoMemory> {
        let mut chunks = Vec::new();
        chunks.try_reserve_exact(nr_chunks(len)).map_err(|_| NoMemory)?;
        for bit in (0..usize::BITS).rev() {
            let size = 1usize << bit;
            if len & size == 0 {
                continue;
            }
            let mut c = Vec::new();
            c.try_reserve_exact(size).map_err(|_| NoMemory)?;
            c.resize(size, 0);
            chunks.push(c);
        }
        Ok(DataBuf { chunks, len })
    }

    /// A copy of `bytes`.
    pub fn try_copy_of(bytes: &[u8]) -> Result<Self, NoMemory> {
        let mut b = Self::try_zeroed(bytes.len())?;
        b.copy_from(0, bytes);
        Ok(b)
    }

    /// What a buffer of `len` bytes takes from the heap: its chunks and the
    /// chunk list.
    pub fn cost(len: usize) -> u64 {
        let list = match nr_chunks(len) {
            0 => 0,
            n => heap_cost(n * core::mem::size_of::<Vec<u8>>(), core::mem::align_of::<Vec<u8>>()),
        };
        (0..usize::BITS).filter(|b| len & (1 << b) != 0).map(|b| heap_cost(1 << b, 1)).sum::<u64>() + list
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The chunks in order.
    pub fn chunks(&self) -> impl Iterator<Item = &[u8]> {
        self.chunks.iter().map(|c| c.as_slice())
    }

    /// The chunks in order, writable (a device DMAs into them).
    pub fn chunks_mut(&mut self) -> impl Iterator<Item = &mut [u8]> {
        self.chunks.iter_mut().map(|c| c.as_mut_slice())
    }

    /// Copies `src` into the buffer from byte `at`; bytes past the end are
    /// not copied.
    pub fn copy_from(&mut self, mut at: usize, mut src: &[u8]) {
        for c in self.chunks.iter_mut() {
            if src.is_empty() {
                break;
            }
            if at >= c.len() {
                at -= c.len();
                continue;
            }
            let n = (c.len() - at).min(src.len());
            c[at..at + n].copy_from_slice(&src[..n]);
            src = &src[n..];
            at = 0;
        }
    }

    /// Copies the whole buffer to `dst` (at most `dst.len()` bytes).
    pub fn copy_to(&self, dst: &mut [u8]) {
        let mut off = 0;
        for c in self.chunks() {
            let n = c.len().min(dst.len() - off);
            dst[off..off + n].copy_from_slice(&c[..n]);
            off += n;
            if off == dst.len() {
                break;
            }
        }
    }

    /// The bytes as one vector (host tests, small buffers).
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = alloc::vec![0; self.len];
        self.copy_to(&mut v);
        v
    }
}

/// Equal when the bytes are, however they are split.
impl PartialEq for DataBuf {
    fn eq(&self, other: &Self) -> bool {
        self.len == other.len && self.chunks().flatten().eq(other.chunks().flatten())
    }
}

impl Eq for DataBuf {}

impl fmt::Debug for DataBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.len <= 32 {
            write!(f, "DataBuf({:?})", self.to_vec())
        } else {
            write!(f, "DataBuf({} bytes in {} chunks)", self.len, self.chunks.len())
        }
    }
}

/// For host tests: the vector's bytes, split as [`DataBuf::try_copy_of`]
/// would (panics when the host is out of memory).
#[cfg(test)]
impl From<Vec<u8>> for DataBuf {
    fn from(v: Vec<u8>) -> Self {
        DataBuf::try_copy_of(&v).unwrap()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_are_the_binary_decomposition() {
        let b = DataBuf::try_zeroed((4 << 20) - 512).unwrap();
        let sizes: Vec<usize> = b.chunks().map(|c| c.len()).collect();
        assert_eq!(sizes.len(), 13);
        assert!(sizes.windows(2).all(|w| w[0] == 2 * w[1]), "{sizes:?}");
        assert_eq!((sizes[0], *sizes.last().unwrap()), (2 << 20, 512));
        assert_eq!(DataBuf::try_zeroed(4 << 20).unwrap().chunks().count(), 1);
        assert_eq!(DataBuf::try_zeroed(0).unwrap(), DataBuf::new());
    }

    #[test]
    fn cost_is_the_length_not_the_next_power_of_two() {
        let odd = (2 << 20) + 512;
        assert_eq!(heap_cost(odd, 1), 4 << 20, "one block would double it");
        assert_eq!(DataBuf::cost(odd), odd as u64 + 64, "two chunks and a list of two");
        assert_eq!(DataBuf::cost(4 << 20), (4 << 20) + 32);
        assert_eq!(DataBuf::cost(0), 0);
        for len in [512, 4096, 12_800, (4 << 20) - 512] {
            let worst = len as u64 + 512;
            assert!(DataBuf::cost(len) <= worst, "{len}: {}", DataBuf::cost(len));
        }
    }

    #[test]
    fn copies_cross_chunks() {
        let data: Vec<u8> = (0..3584u32).map(|i| (i % 251) as u8).collect();
        let mut b = DataBuf::try_zeroed(data.len()).unwrap();
        assert_eq!(b.chunks().count(), 3, "2048 + 1024 + 512");
        b.copy_from(0, &data);
        assert_eq!(b.to_vec(), data);
        b.copy_from(2000, &[9; 100]);
        let mut want = data.clone();
        want[2000..2100].fill(9);
        assert_eq!(b.to_vec(), want);
        let mut short = [0u8; 10];
        b.copy_to(&mut short);
        assert_eq!(short[..], want[..10]);
        assert_eq!(DataBuf::from(want.clone()), b);
        assert_ne!(DataBuf::from(want[..512].to_vec()), b);
    }

    #[test]
    fn an_impossible_buffer_is_an_error() {
        assert_eq!(DataBuf::try_zeroed(usize::MAX / 2 + 1), Err(NoMemory));
    }
}
