//! The lints `cargo xtask test` holds the tree to: rustfmt (rustfmt.toml)
//! and clippy with warnings as errors, on the host build of the workspace
//! and on the bare-metal builds of the hypervisor (whose EL2 code the host
//! build does not compile) and of the conformance guest (whose host build
//! is a stub); and rustdoc's warnings (broken links, stray HTML) as errors.

use crate::setup::TARGET;
use anyhow::{anyhow, Context};
use std::process::Command;

/// Each lint: a name for the summary and its `cargo` arguments.
pub fn commands() -> Vec<(&'static str, Vec<String>)> {
    let v = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    vec![
        ("rustfmt", v(&["fmt", "--all", "--check"])),
        ("clippy (host)", v(&["clippy", "--workspace", "--all-targets", "--", "-D", "warnings"])),
        (
            "clippy (EL2)",
            v(&[
                "clippy",
                "-p",
                "hypervisor",
                "-p",
                "hv-arch-aarch64",
                "-p",
                "hv-core",
                "-p",
                "hv-machine",
                "--target",
                TARGET,
                "--",
                "-D",
                "warnings",
            ]),
        ),
        ("clippy (conformance guest)", v(&["clippy", "-p", "conformance", "--target", TARGET, "--", "-D", "warnings"])),
        ("rustdoc", v(&["doc", "--no-deps", "--workspace"])),
    ]
}

/// The environment a lint runs with: rustdoc takes its `-D warnings` only
/// from `RUSTDOCFLAGS`.
fn env_of(name: &str) -> &'static [(&'static str, &'static str)] {
    if name == "rustdoc" {
        &[("RUSTDOCFLAGS", "-D warnings")]
    } else {
        &[]
    }
}

/// `rustup component add` for clippy and rustfmt (idempotent, quick when
/// they are there).
pub fn ensure_components() -> crate::Result<()> {
    let st = Command::new("rustup")
        .args(["component", "add", "clippy", "rustfmt"])
        .stderr(std::process::Stdio::null())
        .status()
        .context("rustup")?;
    if st.success() {
        Ok(())
    } else {
        Err(anyhow!("`rustup component add clippy rustfmt` failed"))
    }
}

/// Runs every lint in the workspace root; one line each, `(passed, failed)`.
pub fn run() -> (u64, u64) {
    let (mut passed, mut failed) = (0, 0);
    for (name, args) in commands() {
        let ok = Command::new(env!("CARGO"))
            .current_dir(crate::root())
            .args(&args)
            .envs(env_of(name).iter().copied())
            .status()
            .is_ok_and(|s| s.success());
        println!("lint: {name}: {}", if ok { "ok" } else { "FAILED (see above)" });
        if ok {
            passed += 1;
        } else {
            failed += 1;
        }
    }
    (passed, failed)
}

#[cfg(test)]
mod tests {
    #[test]
    fn warnings_are_errors_on_both_builds_and_formatting_is_checked() {
        let cmds = super::commands();
        assert_eq!(cmds.len(), 5);
        assert_eq!(cmds[0].1, ["fmt", "--all", "--check"]);
        for (_, args) in &cmds[1..4] {
            assert_eq!(args[0], "clippy");
            assert!(args.ends_with(&["-D".to_string(), "warnings".to_string()]), "{args:?}");
        }
        assert!(cmds[1].1.contains(&"--all-targets".to_string()));
        assert!(cmds[2].1.contains(&super::TARGET.to_string()));
        for krate in ["hypervisor", "hv-arch-aarch64", "hv-core", "hv-machine"] {
            assert!(cmds[2].1.contains(&krate.to_string()), "EL2 clippy covers {krate}");
        }
        assert!(cmds[3].1.contains(&super::TARGET.to_string()) && cmds[3].1.contains(&"conformance".to_string()));
        assert_eq!(cmds[4].1, ["doc", "--no-deps", "--workspace"]);
        assert_eq!(super::env_of(cmds[4].0), [("RUSTDOCFLAGS", "-D warnings")]);
    }
}
