//! Guest disks: the hypervisor's virtio-blk device over a RAM image, and
//! QEMU's virtio-blk passed through (Dom0-style). Data is checked end to end.

use integration_tests::*;

fn ram_disk(o: &mut RunOptions) {
    o.hv_args = "dom0_disk=ram dom0_disk_latency_us=50".into();
}

#[test]
fn ram_disk_keeps_64_mib_of_random_data() {
    let cmd = "head -c 67108864 /dev/urandom > /tmp/data; a=$(sha256sum < /tmp/data); \
               dd if=/tmp/data of=/dev/vda bs=1M oflag=direct 2>/dev/null; sync; rm /tmp/data; \
               echo 3 > /proc/sys/vm/drop_caches; \
               b=$(dd if=/dev/vda bs=1M count=64 iflag=direct 2>/dev/null | sha256sum); \
               echo \"sums: $a / $b\"; [ \"$a\" = \"$b\" ] && echo SAME";
    let r = run_cmd(cmd, ram_disk);
    assert_console(&r, "SAME");
    assert_eq!(r.guest_exit, Some(0));
    // Served by the hypervisor's device, not QEMU.
    assert!(stat_line(&r.console, "blk0.bytes_written").unwrap() >= 64 << 20);
    assert!(stat_line(&r.console, "blk0.bytes_read").unwrap() >= 64 << 20);
    assert_eq!(stat_line(&r.console, "blk0.io_errors"), Some(0));
}

#[test]
fn fio_verify_on_the_ram_disk() {
    let cmd = "fio --name=v --filename=/dev/vda --rw=randwrite --bs=4k --size=8M --direct=1 \
               --ioengine=psync --verify=crc32c --do_verify=1 --output-format=terse --terse-version=3 >/tmp/out; \
               s=$?; echo fio-status=$s; cut -d';' -f1-5 /tmp/out; exit $s";
    let r = run_cmd(cmd, ram_disk);
    assert_console(&r, "fio-status=0");
    assert_eq!(r.guest_exit, Some(0));
    assert!(stat_line(&r.console, "blk0.writes").unwrap() >= 2048);
}

#[test]
fn fio_verify_on_the_passthrough_disk() {
    let cmd = "fio --name=v --filename=/dev/vda --rw=randwrite --bs=4k --size=8M --direct=1 \
               --ioengine=psync --verify=crc32c --do_verify=1 --output-format=terse --terse-version=3 >/tmp/out; \
               s=$?; echo fio-status=$s; exit $s";
    let r = run_cmd(cmd, with_qemu_disk);
    assert_console(&r, "fio-status=0");
    assert_eq!(r.guest_exit, Some(0));
    // 2048 writes and 2048 verifying reads, one at a time: their completions
    // are the passthrough device's SPI, routed as a forwarded SPI.
    assert!(stat_line(&r.console, "irq.forwarded_spi").unwrap() >= 2048);
}

#[test]
fn passthrough_irq_follows_smp_affinity() {
    // Read with the disk IRQ on CPU0, then on CPU1; print the per-CPU counts.
    let cmd = "n=$(grep virtio0 /proc/interrupts | cut -d: -f1 | tr -d ' '); \
               echo 1 > /proc/irq/$n/smp_affinity; dd if=/dev/vda of=/dev/null bs=4k count=500 iflag=direct 2>/dev/null; \
               echo A $(grep virtio0 /proc/interrupts); \
               echo 2 > /proc/irq/$n/smp_affinity; dd if=/dev/vda of=/dev/null bs=4k skip=600 count=500 iflag=direct 2>/dev/null; \
               echo B $(grep virtio0 /proc/interrupts)";
    // Two pCPUs: the physical SPI also follows the target vCPU's pCPU.
    let r = run_cmd(cmd, |o| {
        o.pcpus = 2;
        o.vcpus = 2;
        with_qemu_disk(o);
    });
    let counts = |tag: &str| -> (u64, u64) {
        let l = r
            .console
            .lines()
            .find(|l| l.starts_with(tag))
            .unwrap_or_else(|| panic!("no {tag} line:\n{}", tail(&r.console, 30)));
        let f: Vec<&str> = l.split_whitespace().collect();
        (f[2].parse().unwrap(), f[3].parse().unwrap())
    };
    let (a0, a1) = counts("A ");
    let (b0, b1) = counts("B ");
    assert!(a0 >= 400, "CPU0 should have taken the first reads' interrupts: {a0} {a1}");
    assert!(b1 >= a1 + 400, "CPU1 should have taken the second reads' interrupts: {a1} -> {b1}");
    assert!(b0 < a0 + 50, "CPU0 kept taking interrupts: {a0} -> {b0}");
}

fn backend_disk(o: &mut RunOptions) {
    o.hv_args = "dom0_disk=backend".into();
    with_qemu_disk(o);
}

#[test]
fn backend_disk_keeps_64_mib_of_random_data() {
    // The guest talks to the hypervisor's virtio-blk; the hypervisor drives
    // QEMU's virtio-blk asynchronously behind it.
    let cmd = "head -c 67108864 /dev/urandom > /tmp/data; a=$(sha256sum < /tmp/data); \
               dd if=/tmp/data of=/dev/vda bs=1M oflag=direct 2>/dev/null; sync; rm /tmp/data; \
               echo 3 > /proc/sys/vm/drop_caches; \
               b=$(dd if=/dev/vda bs=1M count=64 iflag=direct 2>/dev/null | sha256sum); \
               [ \"$a\" = \"$b\" ] && echo SAME";
    let r = run_cmd(cmd, backend_disk);
    assert_console(&r, "over the physical virtio-blk");
    assert_console(&r, "SAME");
    assert_eq!(r.guest_exit, Some(0));
    assert!(stat_line(&r.console, "blk0.bytes_written").unwrap() >= 64 << 20);
    assert_eq!(stat_line(&r.console, "blk0.io_errors"), Some(0));
}

#[test]
fn fio_verify_with_flushes_on_the_backend_disk() {
    let cmd = "fio --name=v --filename=/dev/vda --rw=randwrite --bs=4k --size=8M --direct=1 --fsync=64 \
               --ioengine=psync --verify=crc32c --do_verify=1 --output-format=terse --terse-version=3 >/tmp/out; \
               s=$?; echo fio-status=$s; exit $s";
    let r = run_cmd(cmd, backend_disk);
    assert_console(&r, "fio-status=0");
    assert_eq!(r.guest_exit, Some(0));
    assert!(stat_line(&r.console, "blk0.writes").unwrap() >= 2048);
    assert!(stat_line(&r.console, "blk0.flushes").unwrap() >= 1, "FLUSH never reached the backend");
    // The physical disk's completions came through its route.
    assert!(stat_line(&r.console, "irq.phys_disk").unwrap() >= 2048);
    assert_eq!(stat_line(&r.console, "irq.forwarded_spi"), Some(0));
}

/// fio with libaio at queue depth 8, mixed random reads and writes, an
/// fsync (a virtio-blk FLUSH) every 4 writes and every write verified
/// (interleaved, verify_backlog, and in the final verify phase) on the
/// backend disk. FLUSH must not go through virtio-drivers' blocking flush,
/// which fails with WrongToken when another request finishes first and then
/// loses every later completion.
#[test]
fn fio_libaio_qd8_randrw_fsync_verify_on_the_backend_disk() {
    let cmd = "fio --name=v --filename=/dev/vda --ioengine=libaio --iodepth=8 --rw=randrw --fsync=4 \
               --bs=4k --size=8M --direct=1 --verify=crc32c --do_verify=1 --verify_backlog=64 --verify_fatal=1 \
               --output-format=terse --terse-version=3 >/tmp/out; \
               s=$?; echo fio-status=$s; cut -d';' -f1-5 /tmp/out; exit $s";
    let r = run_cmd(cmd, |o| {
        backend_disk(o);
        o.timeout = std::time::Duration::from_secs(300);
    });
    assert_console(&r, "fio-status=0");
    assert_eq!(r.guest_exit, Some(0));
    let s = |n: &str| stat_line(&r.console, n).unwrap_or_else(|| panic!("no blk0.{n}"));
    eprintln!(
        "reads={} writes={} flushes={} in_flight_hwm={} io_errors={}",
        s("blk0.reads"),
        s("blk0.writes"),
        s("blk0.flushes"),
        s("blk0.in_flight_hwm"),
        s("blk0.io_errors")
    );
    assert_eq!(s("blk0.io_errors"), 0);
    assert_eq!(s("blk0.backend_errors"), 0);
    assert!(s("blk0.writes") >= 1000 && s("blk0.reads") >= 1000);
    assert!(s("blk0.flushes") >= 250, "FLUSH did not reach the backend often enough");
    // Requests really were in flight together (queue depth > 1) ... How
    // many of fio's 8 the backend holds at once depends on how the host
    // runs QEMU's threads under TCG (3 to 8 seen, 3 on a loaded host); a
    // FLUSH overtaken by another completion needs only 2.
    assert!(s("blk0.in_flight_hwm") >= 2);
    // ... and every one of them came back.
    assert_eq!(s("blk0.completions"), s("blk0.reads") + s("blk0.writes") + s("blk0.flushes"));
    assert_eq!(s("blk0.in_flight"), 0);
    assert_eq!(s("blk0.unknown_completions"), 0);
}

/// Bad lengths in a real guest: requests Linux never sends, written by
/// hand into a virtqueue with devmem (tests/guest/virtq.sh): an IN and an
/// OUT without data, a read of 100 bytes and one at sector 2^64-1. On the
/// backend disk an empty IN that reached virtio-drivers'
/// `assert_ne!(buf.len(), 0)` would panic at EL2 and power the machine off. Each must
/// get IOERR, a good read afterwards OK, and Linux must get the device back.
#[test]
fn backend_disk_answers_malformed_requests_with_ioerr() {
    let cmd = ". /tests/virtq.sh
        printf hvok | dd of=/dev/vda bs=512 conv=sync oflag=direct 2>/dev/null
        vq_find; vq_free_ram; vq_unbind; vq_setup || exit 1
        n=0
        for req in '0 0 0 0 zero-in' '1 1 0 0 zero-out' '2 0 0 100 short-in' '3 0 0xffffffffffffffff 512 wrap-in' '4 0 0 512 good-in'; do
            set -- $req
            vq_req $1 $2 $3 $4; vq_offer $VQ_HEAD; vq_notify
            n=$((n + 1)); vq_wait_used $n || echo \"$5: no answer\"
            echo \"$5 used=$(vq_used_idx) len=$(vq_used_len $((n - 1))) status=$(vq_status $1)\"
        done
        echo \"data=$(devmem $((VQ_DATA + 4 * 512)) 32)\"
        w32 0x70 0; vq_rebind; sleep 1
        d=$(ls /sys/block | grep vd | head -1)
        echo \"rebound: $(dd if=/dev/$d bs=512 count=1 iflag=direct 2>/dev/null | head -c 4)\"";
    let r = run_cmd(cmd, |o| {
        backend_disk(o);
        with_virtq(o);
    });
    assert_console(&r, "zero-in used=1 len=1 status=1");
    assert_console(&r, "zero-out used=2 len=1 status=1");
    assert_console(&r, "short-in used=3 len=1 status=1");
    assert_console(&r, "wrap-in used=4 len=1 status=1");
    assert_console(&r, "good-in used=5 len=513 status=0");
    assert_console(&r, "data=0x6B6F7668");
    assert_console(&r, "rebound: hvok");
    assert_eq!(r.guest_exit, Some(0));
    assert_eq!(stat_line(&r.console, "blk0.io_errors"), Some(4));
    assert_eq!(stat_line(&r.console, "blk0.backend_errors"), Some(0));
}

/// QueueReady toggles in a real guest: eight 4 MiB reads on the RAM disk
/// with a 500 ms service time, and QueueReady toggled (0, 1, notify) as
/// fast as devmem goes for 8 s, each time making the device see all eight
/// again. The orphaned reads (far more than 48 MiB of them over the run)
/// keep their budget until they finish, and every request is accounted
/// for: a device that forgot them at every toggle while the backend kept
/// them would exhaust the 48 MiB heap with their read buffers, allocated at
/// the deadline, and the allocator would panic.
#[test]
fn ram_disk_survives_queue_ready_toggling_under_4_mib_reads() {
    let cmd = ". /tests/virtq.sh
        vq_find; vq_free_ram; vq_unbind; vq_setup || exit 1
        for s in 0 1 2 3 4 5 6 7; do vq_req $s 0 $((s * 8192)) 0x400000; vq_offer $VQ_HEAD; done
        vq_notify
        read up _ < /proc/uptime; t0=${up%.*}; n=0
        while [ $(( ${up%.*} - t0 )) -lt 8 ]; do
            w32 0x44 0; w32 0x44 1; vq_notify
            n=$((n + 1)); read up _ < /proc/uptime
        done
        echo \"toggled $n times\"
        sleep 2
        w32 0x70 0; vq_rebind; sleep 1
        d=$(ls /sys/block | grep vd | head -1)
        dd if=/dev/$d of=/dev/null bs=1M count=8 iflag=direct 2>/dev/null && echo 'rebound ok'";
    let r = run_cmd(cmd, |o| {
        o.hv_args = "dom0_disk=ram dom0_disk_latency_us=500000".into();
        with_virtq(o);
    });
    assert_console(&r, "rebound ok");
    assert_eq!(r.guest_exit, Some(0));
    let toggles: u64 = r
        .console
        .lines()
        .find_map(|l| {
            l.trim().strip_prefix("toggled ").and_then(|t| t.strip_suffix(" times")).and_then(|n| n.parse().ok())
        })
        .unwrap_or_else(|| panic!("no toggle count; tail:\n{}", tail(&r.console, 40)));
    let s = |n: &str| stat_line(&r.console, n).unwrap_or_else(|| panic!("no blk0.{n}"));
    eprintln!(
        "toggles={toggles} reads={} orphaned={} stale={} stalls={} in_flight_bytes_hwm={}",
        s("blk0.reads"),
        s("blk0.orphaned"),
        s("blk0.stale_completions"),
        s("blk0.stalls"),
        s("blk0.in_flight_bytes_hwm")
    );
    assert!(toggles >= 20, "only {toggles} toggles");
    // More than 48 MiB of 4 MiB reads were orphaned and finished.
    assert!(s("blk0.stale_completions") >= 13, "stale_completions={}", s("blk0.stale_completions"));
    assert_eq!(s("blk0.stale_completions"), s("blk0.orphaned"));
    // Every request accounted for, nothing left, the budget held.
    assert_eq!(s("blk0.completions"), s("blk0.reads") + s("blk0.writes") + s("blk0.flushes"));
    assert_eq!(s("blk0.in_flight"), 0);
    assert_eq!(s("blk0.unknown_completions"), 0);
    assert!(s("blk0.in_flight_bytes_hwm") <= 16 << 20, "in_flight_bytes_hwm={}", s("blk0.in_flight_bytes_hwm"));
}

/// A guest that queues ten 4 MiB writes before one notify (driven by hand
/// with devmem, tests/guest/virtq.sh), on a RAM disk with a 300 ms service
/// time: the requests are charged to Dom0's heap quota as they are taken,
/// so only what fits the quota (10 MiB here, below the device's own 16 MiB
/// budget; the first 4 MiB request charged up front) is in flight at once; the rest wait in the ring
/// (`quota_stalls`, the quota's `refused`) and are taken as earlier ones
/// complete. Every write is answered OK and reaches the disk; the quota's
/// high-water mark stays within its limit, which the boot plan reserved in
/// the heap.
#[test]
fn queued_4_mib_writes_wait_for_the_heap_quota_and_all_complete() {
    let cmd = ". /tests/virtq.sh
        vq_find; vq_free_ram; vq_unbind; vq_setup || exit 1
        for s in 0 1 2 3 4 5 6 7 8 9; do
            devmem $((VQ_DATA + s * 0x400000)) 32 $((0x51a70000 + s))
            vq_req $s 1 $((s * 8192)) 0x400000; vq_offer $VQ_HEAD
        done
        vq_notify
        vq_wait_used 10 || echo 'not all answered'
        ok=0; for s in 0 1 2 3 4 5 6 7 8 9; do [ $(vq_status $s) = 0 ] && ok=$((ok + 1)); done
        echo \"answered=$(vq_used_idx) ok=$ok\"
        w32 0x70 0; vq_rebind; sleep 1
        d=$(ls /sys/block | grep vd | head -1)
        for s in 0 5 9; do
            echo \"sector$s=$(dd if=/dev/$d bs=512 skip=$((s * 8192)) count=1 iflag=direct 2>/dev/null | od -An -tx4 -N4 | tr -d ' ')\"
        done";
    let r = run_cmd(cmd, |o| {
        o.hv_args = "dom0_disk=ram dom0_disk_latency_us=300000 dom0_heap_quota=10M".into();
        with_virtq(o);
    });
    assert_console(&r, "answered=10 ok=10");
    for s in [0u32, 5, 9] {
        assert_console(&r, &format!("sector{s}={:08x}", 0x51a7_0000 + s));
    }
    assert_eq!(r.guest_exit, Some(0));
    let s = |n: &str| stat_line(&r.console, n).unwrap_or_else(|| panic!("no {n}"));
    eprintln!(
        "quota used={} hwm={} limit={} refused={}; blk0 stalls={} quota_stalls={} in_flight_hwm={}; heap hwm={} size={}",
        s("quota.used"),
        s("quota.hwm"),
        s("quota.limit"),
        s("quota.refused"),
        s("blk0.stalls"),
        s("blk0.quota_stalls"),
        s("blk0.in_flight_hwm"),
        s("heap.hwm"),
        s("heap.size")
    );
    assert!(s("blk0.quota_stalls") >= 1, "the quota never held a request back");
    assert!(s("quota.refused") >= 1);
    assert!(s("quota.hwm") <= s("quota.limit"));
    assert_eq!(s("blk0.in_flight_hwm"), 2, "the floor's request and one more fit 10 MiB");
    assert!(s("heap.hwm") <= s("heap.size"));
    assert!(s("blk0.writes") >= 10);
    assert_eq!(s("blk0.io_errors"), 0);
}
