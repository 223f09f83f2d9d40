//! The device's fixed parameters and the wire constants of virtio-blk:
//! device ID, request types, status values, the GET_ID and config-space
//! sizes, [`BlkConfig`] with the feature bits it offers and the
//! `struct virtio_blk_config` bytes it shows the driver. Depends on no
//! sibling: everything else in `blk` reads these.

use super::super::features;

pub const VIRTIO_ID_BLOCK: u32 = 2;
pub const SECTOR_SIZE: u64 = 512;

pub const T_IN: u32 = 0;
pub const T_OUT: u32 = 1;
pub const T_FLUSH: u32 = 4;
pub const T_GET_ID: u32 = 8;

pub const S_OK: u8 = 0;
pub const S_IOERR: u8 = 1;
pub const S_UNSUPP: u8 = 2;

/// Bytes in the GET_ID answer.
pub const ID_BYTES: usize = 20;
/// Bytes of `struct virtio_blk_config` the device fills (up to and
/// including the write-zeroes fields; the rest reads as zero).
pub const CONFIG_LEN: usize = 60;
pub(super) const HEADER_LEN: u64 = 16;

/// What to do with a chain that has no usable status byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BadChainPolicy {
    /// Return the head with used length 0 and keep serving.
    ReturnUnused,
    /// Set DEVICE_NEEDS_RESET and stop.
    NeedsReset,
}

/// The device's fixed parameters.
#[derive(Clone, Debug)]
pub struct BlkConfig {
    /// Disk size in 512-byte sectors.
    pub capacity_sectors: u64,
    /// Offer VIRTIO_BLK_F_RO and fail writes.
    pub read_only: bool,
    /// GET_ID answer (NUL-padded, not necessarily NUL-terminated).
    pub serial: [u8; ID_BYTES],
    /// QueueNumMax (a power of two).
    pub queue_size_max: u16,
    /// Advertised seg_max (VIRTIO_BLK_F_SEG_MAX): data segments per request.
    pub seg_max: u32,
    /// Advertised size_max (VIRTIO_BLK_F_SIZE_MAX) when `Some`.
    pub size_max: Option<u32>,
    /// Advertised blk_size (VIRTIO_BLK_F_BLK_SIZE), the logical block size.
    pub blk_size: u32,
    /// Largest data transfer of one request; larger ones get IOERR.
    pub max_request_bytes: u32,
    /// Most data bytes of all in-flight requests together (write data is
    /// held by the device/backend until completion, read buffers by the
    /// backend): further chains wait in the ring. Bounds the hypervisor heap
    /// a guest can tie up; one request is always admitted when none is in
    /// flight. Requests orphaned by a reset count until the backend
    /// finishes them.
    pub max_in_flight_bytes: u64,
    /// Most requests held by the backend at once (live and orphaned).
    pub max_in_flight_requests: usize,
    /// Offer VIRTIO_F_INDIRECT_DESC.
    pub indirect_desc: bool,
    pub bad_chain_policy: BadChainPolicy,
    /// VendorID register.
    pub vendor_id: u32,
}

impl BlkConfig {
    pub fn new(capacity_sectors: u64, read_only: bool) -> Self {
        let mut serial = [0u8; ID_BYTES];
        serial[..8].copy_from_slice(b"hv-vblk0");
        Self {
            capacity_sectors,
            read_only,
            serial,
            queue_size_max: 128,
            seg_max: 126,
            size_max: None,
            blk_size: 512,
            max_request_bytes: 4 << 20,
            max_in_flight_bytes: 16 << 20,
            max_in_flight_requests: 128,
            indirect_desc: true,
            bad_chain_policy: BadChainPolicy::ReturnUnused,
            // "HVVB", like QEMU's "QEMU" (0x554d4551).
            vendor_id: 0x4256_5648,
        }
    }

    /// The feature bits the device offers.
    pub fn features(&self) -> u64 {
        let mut f = features::VERSION_1 | features::BLK_SEG_MAX | features::BLK_BLK_SIZE | features::BLK_FLUSH;
        if self.read_only {
            f |= features::BLK_RO;
        }
        if self.size_max.is_some() {
            f |= features::BLK_SIZE_MAX;
        }
        if self.indirect_desc {
            f |= features::RING_INDIRECT_DESC;
        }
        f
    }

    /// `struct virtio_blk_config`, little endian.
    pub fn config_space(&self) -> [u8; CONFIG_LEN] {
        let mut c = [0u8; CONFIG_LEN];
        c[0..8].copy_from_slice(&self.capacity_sectors.to_le_bytes());
        c[8..12].copy_from_slice(&self.size_max.unwrap_or(0).to_le_bytes());
        c[12..16].copy_from_slice(&self.seg_max.to_le_bytes());
        // geometry (16..20) not offered; blk_size:
        c[20..24].copy_from_slice(&self.blk_size.to_le_bytes());
        // topology (24..32) and writeback (32) not offered; num_queues:
        c[34..36].copy_from_slice(&1u16.to_le_bytes());
        c
    }
}
