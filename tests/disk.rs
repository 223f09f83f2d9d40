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
        let l = r.console.lines().find(|l| l.starts_with(tag)).unwrap_or_else(|| panic!("no {tag} line:\n{}", tail(&r.console, 30)));
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
}
