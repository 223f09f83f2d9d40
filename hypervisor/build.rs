//! Passes the linker script and the platform directory for bare-metal
//! builds; host builds (unit tests) need neither.
use std::path::PathBuf;

fn main() {
    let target_os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let platform = std::env::var("HV_PLATFORM").unwrap_or_else(|_| "qemu-virt".into());
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap()).join("..");
    let pdir = root.join("platforms").join(&platform);
    println!("cargo:rerun-if-env-changed=HV_PLATFORM");
    println!("cargo:rerun-if-changed={}", pdir.display());
    println!("cargo:rerun-if-changed={}", root.join("linker/hypervisor.ld").display());
    println!("cargo:rustc-env=HV_PLATFORM_RS={}", pdir.join("platform.rs").display());
    if target_os == "none" {
        println!("cargo:rustc-link-arg-bins=-T{}", root.join("linker/hypervisor.ld").display());
        println!("cargo:rustc-link-arg-bins=-L{}", pdir.display());
        // Position-independent (with `-C relocation-model=pie` from
        // .cargo/config.toml): the linker leaves R_AARCH64_RELATIVE entries
        // in .rela.dyn for the entry code to apply wherever the image runs.
        // `-z notext`: the prebuilt core/alloc are not PIC and keep absolute
        // pointers in .rodata (switch tables, vtables); those become
        // relocations too, applied while the MMU is still off.
        for arg in ["--pie", "--no-dynamic-linker", "-z", "notext"] {
            println!("cargo:rustc-link-arg-bins={arg}");
        }
    }
}
