//! Passes the linker script for the bare-metal build; the host stub needs none.
//!
//! With `CONFORMANCE_LINK_BASE=<hex address>` the guest is instead linked
//! as a fixed-address executable (ET_EXEC, not PIE) at that address: the
//! ELF kernel the hypervisor loads by its program headers
//! (`xtask::build::conformance_elf`). The entry code then finds no
//! relocation to apply.
use std::path::PathBuf;

fn main() {
    let dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let script = dir.join("conformance.ld");
    println!("cargo:rerun-if-changed={}", script.display());
    println!("cargo:rerun-if-env-changed=CONFORMANCE_LINK_BASE");
    let bare = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default() == "none";
    if let (true, Ok(base)) = (bare, std::env::var("CONFORMANCE_LINK_BASE")) {
        let hex = base.trim_start_matches("0x");
        u64::from_str_radix(hex, 16).expect("CONFORMANCE_LINK_BASE: a hex address");
        let text = std::fs::read_to_string(&script).unwrap();
        assert!(text.contains("\n    . = 0;\n"), "conformance.ld: the `. = 0;` line moved");
        let fixed = PathBuf::from(std::env::var("OUT_DIR").unwrap()).join("conformance-fixed.ld");
        std::fs::write(&fixed, text.replacen("\n    . = 0;\n", &format!("\n    . = 0x{hex};\n"), 1)).unwrap();
        println!("cargo:rustc-link-arg-bins=-T{}", fixed.display());
        println!("cargo:rustc-link-arg-bins=--no-pie");
        return;
    }
    if bare {
        println!("cargo:rustc-link-arg-bins=-T{}", script.display());
        // Position-independent like the hypervisor (relocation-model=pie from
        // .cargo/config.toml): loaders put an Image anywhere on a 2 MiB
        // boundary, and the entry code applies .rela.dyn for where it runs.
        for arg in ["--pie", "--no-dynamic-linker", "-z", "notext"] {
            println!("cargo:rustc-link-arg-bins={arg}");
        }
    }
}
