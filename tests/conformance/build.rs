//! Passes the linker script for the bare-metal build; the host stub needs none.
use std::path::PathBuf;

fn main() {
    let dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let script = dir.join("conformance.ld");
    println!("cargo:rerun-if-changed={}", script.display());
    if std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default() == "none" {
        println!("cargo:rustc-link-arg-bins=-T{}", script.display());
        // Position-independent like the hypervisor (relocation-model=pie from
        // .cargo/config.toml): loaders put an Image anywhere on a 2 MiB
        // boundary, and the entry code applies .rela.dyn for where it runs.
        for arg in ["--pie", "--no-dynamic-linker", "-z", "notext"] {
            println!("cargo:rustc-link-arg-bins={arg}");
        }
    }
}
