//! The arm64 Image header (Linux `Documentation/arch/arm64/booting.rst`):
//! how much RAM a kernel needs once loaded.

use super::plan::LayoutError;

/// Length of the arm64 Image header.
pub const HEADER_LEN: usize = 64;

/// The RAM a kernel Image occupies once loaded: the header's `image_size`
/// (text, data and BSS), or the file length when the header says 0
/// (kernels before 3.17) or less than the file. `header` is the start of the
/// module (at least [`HEADER_LEN`] bytes), `file_len` its length.
pub fn arm64_image_size(header: &[u8], file_len: u64) -> Result<u64, LayoutError> {
    if header.len() < HEADER_LEN || file_len < HEADER_LEN as u64 {
        return Err(LayoutError::BadKernel("shorter than the 64-byte arm64 Image header"));
    }
    if header[0x38..0x3c] != *b"ARM\x64" {
        return Err(LayoutError::BadKernel("no arm64 Image magic (ARM\\x64 at offset 0x38)"));
    }
    let mut size = [0u8; 8];
    size.copy_from_slice(&header[16..24]);
    Ok(u64::from_le_bytes(size).max(file_len))
}
