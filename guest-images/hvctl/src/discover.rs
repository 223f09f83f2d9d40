//! Finding the control device: Dom0's device tree node
//! `/hypervisor/control@<addr>` (`compatible = "hvrust,control-1"`), or the
//! `HVCTL_ADDR` environment variable. In an ACPI boot Linux keeps the DT
//! flat (only `/chosen` is read), so the node is read from the blob at
//! `/sys/firmware/fdt` there.

use std::path::Path;

/// The node's `compatible` string.
pub const COMPATIBLE: &str = "hvrust,control-1";

/// Where Linux shows the device tree, in the order tried.
pub const DT_DIRS: [&str; 2] = ["/proc/device-tree/hypervisor", "/sys/firmware/devicetree/base/hypervisor"];

/// The base address from a `reg` property of 2 address and 2 size cells
/// (big-endian u32s); `None` when it is shorter.
pub fn reg_address(reg: &[u8]) -> Option<u64> {
    let cell = |i: usize| reg.get(4 * i..4 * i + 4).map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]));
    Some(u64::from(cell(0)?) << 32 | u64::from(cell(1)?))
}

/// Whether a `compatible` property (NUL-separated strings) names ours.
pub fn is_compatible(prop: &[u8]) -> bool {
    prop.split(|&b| b == 0).any(|s| s == COMPATIBLE.as_bytes())
}

/// Parses `HVCTL_ADDR` (`0x…` hexadecimal, or decimal).
pub fn parse_addr(s: &str) -> Option<u64> {
    let s = s.trim();
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => s.parse().ok(),
    }
}

/// The control node's address under `dir` (a `hypervisor` node), if any.
pub fn find_in(dir: &Path) -> Option<u64> {
    let mut names: Vec<_> = std::fs::read_dir(dir).ok()?.map_while(Result::ok).map(|e| e.path()).collect();
    names.sort();
    names.into_iter().find_map(|node| {
        let name = node.file_name()?.to_str()?;
        if !name.starts_with("control@") || !is_compatible(&std::fs::read(node.join("compatible")).ok()?) {
            return None;
        }
        reg_address(&std::fs::read(node.join("reg")).ok()?)
    })
}

/// Where Linux exposes the flat DT it booted with.
pub const FDT_BLOB: &str = "/sys/firmware/fdt";

/// The control node's address in a flat device tree blob, if any.
pub fn find_in_blob(blob: &[u8]) -> Option<u64> {
    let fdt = fdt::Fdt::new(blob).ok()?;
    let hv = fdt.find_node("/hypervisor")?;
    let ours = |n: &fdt::node::FdtNode<'_, '_>| {
        n.name.starts_with("control@") && n.property("compatible").is_some_and(|c| is_compatible(c.value))
    };
    let node = hv.children().find(ours)?;
    reg_address(node.property("reg")?.value)
}

/// The device's physical address: `HVCTL_ADDR`, else the device tree.
pub fn find() -> Result<u64, String> {
    if let Ok(v) = std::env::var("HVCTL_ADDR") {
        return parse_addr(&v).ok_or_else(|| format!("HVCTL_ADDR={v}: not an address"));
    }
    DT_DIRS
        .iter()
        .find_map(|d| find_in(Path::new(d)))
        .or_else(|| find_in_blob(&std::fs::read(FDT_BLOB).ok()?))
        .ok_or_else(|| "no control device (not running as Dom0 under the hypervisor?)".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_node_from_a_device_tree_directory() {
        let dir = std::env::temp_dir().join(format!("hvctl-dt-{}", std::process::id()));
        let node = dir.join("control@8c000000");
        std::fs::create_dir_all(&node).unwrap();
        std::fs::create_dir_all(dir.join("other@0")).unwrap();
        std::fs::write(node.join("compatible"), b"hvrust,control-1\0").unwrap();
        std::fs::write(node.join("reg"), [0, 0, 0, 1, 0x8c, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10, 0]).unwrap();
        assert_eq!(find_in(&dir), Some(0x1_8c00_0000));
        std::fs::write(node.join("compatible"), b"other,thing\0").unwrap();
        assert_eq!(find_in(&dir), None, "another device's node");
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(find_in(&dir), None, "no directory");
    }

    #[test]
    fn parses_properties_and_the_override() {
        assert_eq!(reg_address(&[0, 0, 0, 0, 0x09, 0, 0x10, 0]), Some(0x0900_1000));
        assert_eq!(reg_address(&[0, 0, 0]), None);
        assert!(is_compatible(b"a,b\0hvrust,control-1\0"));
        assert!(!is_compatible(b"hvrust,control-10\0"));
        assert_eq!(parse_addr("0x8c000000"), Some(0x8c00_0000));
        assert_eq!(parse_addr("4096"), Some(4096));
        assert_eq!(parse_addr("zz"), None);
    }

    #[test]
    fn reads_the_node_from_a_flat_blob() {
        // The ACPI boot's DT (a `/chosen` and `/hypervisor`), written by
        // the hypervisor's own code.
        use hv_machine::region::Region;
        let page = Region { base: 0x4020_0000, size: 0x1000 };
        let mmap = Region { base: 0x7fe1_1000, size: 200 };
        let blob = hv_machine::firmware::dom0_efi::chosen_dtb("acpi=force", None, 0x7fe1_0000, mmap, Some(page));
        assert_eq!(find_in_blob(&blob.unwrap()), Some(0x4020_0000));
        assert_eq!(find_in_blob(b"not a dtb"), None);
    }
}
