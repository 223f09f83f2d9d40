# virtq.sh: drive a virtio-mmio (version 2) virtio-blk device by hand from
# the guest shell with busybox devmem, the way a hostile or buggy driver
# could: the tests use it to send requests Linux never sends and to toggle
# QueueReady under load. Sourced by the integration tests (tests/lib.rs puts
# it into the initramfs as /tests/virtq.sh). Functions keep their scratch
# variables local; the VQ_* variables are the caller's.
#
# Needs (see tests/lib.rs `with_virtq`): the guest booted with mem= below its
# RAM, so that /dev/mem may map the RAM above (CONFIG_STRICT_DEVMEM refuses
# System RAM), and the device unbound from Linux (vq_unbind), so that its
# MMIO frame is no longer claimed (CONFIG_IO_STRICT_DEVMEM). /dev/mem maps
# that RAM as Device memory while the hypervisor reads it cacheable: fine
# under QEMU (no cache model), not a recipe for real hardware.
#
# Layout in the free RAM at VQ_MEM: descriptor table +0, avail ring
# +0x1000, used ring +0x2000, request headers +0x3000 (16 bytes a slot),
# status bytes +0x3800 (one a slot), data from +0x100000 (VQ_DATA).

VQ_N=32

# The first virtio device's platform device (e.g. a003e00.virtio_mmio) and
# its MMIO frame.
vq_find() {
    VQ_DEV=$(basename "$(readlink -f /sys/bus/virtio/devices/virtio0/..)")
    VQ_BASE=$((0x${VQ_DEV%%.*}))
}

# Take the device from Linux (releases the MMIO region) / give it back.
vq_unbind() { echo "$VQ_DEV" > /sys/bus/platform/drivers/virtio-mmio/unbind; }
vq_rebind() { echo "$VQ_DEV" > /sys/bus/platform/drivers/virtio-mmio/bind; }

# The RAM above the last "System RAM" range (rounded up to 2 MiB).
vq_free_ram() {
    local e
    e=$(grep "System RAM" /proc/iomem | tail -1 | sed 's/^ *[0-9a-f]*-\([0-9a-f]*\) .*/\1/')
    VQ_MEM=$(( (0x$e + 1 + 0x1fffff) & ~0x1fffff ))
    VQ_DESC=$VQ_MEM
    VQ_AVAIL=$((VQ_MEM + 0x1000))
    VQ_USED=$((VQ_MEM + 0x2000))
    VQ_HDR=$((VQ_MEM + 0x3000))
    VQ_ST=$((VQ_MEM + 0x3800))
    VQ_DATA=$((VQ_MEM + 0x100000))
}

r32() { echo $(( $(devmem $((VQ_BASE + $1)) 32) )); }
w32() { devmem $((VQ_BASE + $1)) 32 $(($2)); }

# Program queue 0's size and ring addresses and set QueueReady.
vq_queue() {
    w32 0x30 0
    w32 0x38 $VQ_N
    w32 0x80 $((VQ_DESC & 0xffffffff)); w32 0x84 $((VQ_DESC >> 32))
    w32 0x90 $((VQ_AVAIL & 0xffffffff)); w32 0x94 $((VQ_AVAIL >> 32))
    w32 0xa0 $((VQ_USED & 0xffffffff)); w32 0xa4 $((VQ_USED >> 32))
    w32 0x44 1
}

# Reset, the status handshake with VERSION_1 only, queue 0, DRIVER_OK.
# Empty rings. Fails when the device refuses.
vq_setup() {
    [ "$(r32 0)" = $((0x74726976)) ] || { echo "virtq: no virtio-mmio magic at $VQ_BASE"; return 1; }
    w32 0x70 0
    w32 0x70 1; w32 0x70 3
    w32 0x24 1; w32 0x20 1
    w32 0x24 0; w32 0x20 0
    w32 0x70 11
    [ $(( $(r32 0x70) & 8 )) = 8 ] || { echo "virtq: FEATURES_OK refused"; return 1; }
    devmem $VQ_AVAIL 32 0
    devmem $VQ_USED 32 0
    vq_queue
    [ "$(r32 0x44)" = 1 ] || { echo "virtq: QueueReady refused"; return 1; }
    w32 0x70 15
    VQ_NEXT=0
}

# vq_desc INDEX ADDR LEN FLAGS NEXT (flags: 1 NEXT, 2 WRITE).
vq_desc() {
    local a=$((VQ_DESC + 16 * $1))
    devmem $a 64 $(($2)); devmem $((a + 8)) 32 $(($3))
    devmem $((a + 12)) 16 $(($4)); devmem $((a + 14)) 16 $(($5))
}

# vq_hdr SLOT TYPE SECTOR: a request header; its status byte is set to 0xff.
vq_hdr() {
    local a=$((VQ_HDR + 16 * $1))
    # devmem parses TYPE and SECTOR itself (0x... or decimal, all 64 bits).
    devmem $a 32 $2; devmem $((a + 4)) 32 0; devmem $((a + 8)) 64 $3
    devmem $((VQ_ST + $1)) 8 0xff
}

# vq_req SLOT TYPE SECTOR DATA_LEN: a request in slot SLOT with its data
# (when DATA_LEN > 0) at VQ_DATA + SLOT * DATA_LEN, as a chain of header,
# data and status descriptors from index VQ_NEXT; prints the head.
vq_req() {
    local h dflag
    vq_hdr $1 $2 $3
    h=$VQ_NEXT
    if [ $(($4)) -gt 0 ]; then
        dflag=$(( $2 == 0 ? 3 : 1 ))
        vq_desc $h $((VQ_HDR + 16 * $1)) 16 1 $((h + 1))
        vq_desc $((h + 1)) $((VQ_DATA + $1 * $4)) $4 $dflag $((h + 2))
        vq_desc $((h + 2)) $((VQ_ST + $1)) 1 2 0
        VQ_NEXT=$((h + 3))
    else
        vq_desc $h $((VQ_HDR + 16 * $1)) 16 1 $((h + 1))
        vq_desc $((h + 1)) $((VQ_ST + $1)) 1 2 0
        VQ_NEXT=$((h + 2))
    fi
    VQ_HEAD=$h
}

# Make chain HEAD available (no notify).
vq_offer() {
    local i=$(( $(devmem $((VQ_AVAIL + 2)) 16) ))
    devmem $((VQ_AVAIL + 4 + 2 * (i % VQ_N))) 16 $1
    devmem $((VQ_AVAIL + 2)) 16 $(( (i + 1) & 0xffff ))
}

vq_notify() { w32 0x50 0; }
vq_used_idx() { echo $(( $(devmem $((VQ_USED + 2)) 16) )); }
vq_used_len() { echo $(( $(devmem $((VQ_USED + 8 + 8 * ($1 % VQ_N))) 32) )); }
vq_status() { echo $(( $(devmem $((VQ_ST + $1)) 8) )); }

# Wait (up to ~5 s) until the used index reaches $1.
vq_wait_used() {
    local t=0
    while [ "$(vq_used_idx)" -lt $1 ] && [ $t -lt 50 ]; do usleep 100000; t=$((t + 1)); done
    [ "$(vq_used_idx)" -ge $1 ]
}
