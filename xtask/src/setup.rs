//! Installs what a fresh Debian machine lacks: the bare-metal Rust target
//! and QEMU. Each step is idempotent and quick when already done.

use crate::Result;
use std::process::Command;

pub const TARGET: &str = "aarch64-unknown-none-softfloat";

fn have(cmd: &str) -> bool {
    Command::new("sh").arg("-c").arg(format!("command -v {cmd} >/dev/null 2>&1")).status().is_ok_and(|s| s.success())
}

/// `rustup target add` when the target's standard library is missing.
pub fn ensure_target() -> Result<()> {
    let out = Command::new("rustup").args(["target", "list", "--installed"]).output();
    if let Ok(o) = &out {
        if String::from_utf8_lossy(&o.stdout).lines().any(|l| l.trim() == TARGET) {
            return Ok(());
        }
    }
    eprintln!("xtask: installing Rust target {TARGET}");
    let st = Command::new("rustup").args(["target", "add", TARGET]).status().map_err(|e| format!("rustup: {e}"))?;
    if !st.success() {
        return Err(format!("`rustup target add {TARGET}` failed"));
    }
    Ok(())
}

/// The `apt-get` arguments that install `packages`. `--no-remove` makes apt
/// abort rather than remove anything, so `-y` can never confirm a removal;
/// a downgrade or a held package makes `-y` abort by itself.
pub fn install_args(packages: &[&str]) -> Vec<String> {
    let mut a: Vec<String> =
        ["install", "-y", "-qq", "--no-remove", "--no-install-recommends"].map(String::from).to_vec();
    a.extend(packages.iter().map(|p| p.to_string()));
    a
}

/// The whole install command line: through `sudo` unless `root`, with a
/// non-interactive debconf (set by `env`, so it survives sudo's env_reset).
pub fn install_command(packages: &[&str], root: bool) -> Vec<String> {
    let mut c: Vec<String> = if root { Vec::new() } else { vec!["sudo".into()] };
    c.extend(["env", "DEBIAN_FRONTEND=noninteractive", "apt-get"].map(String::from));
    c.extend(install_args(packages));
    c
}

/// The `apt-get` arguments that simulate the same install (`-s`: no root
/// needed, nothing changes), so its consequences can be read first.
pub fn simulate_args(packages: &[&str]) -> Vec<String> {
    let mut a: Vec<String> = ["-s", "install", "--no-install-recommends"].map(String::from).to_vec();
    a.extend(packages.iter().map(|p| p.to_string()));
    a
}

/// What `apt-get -s install` (run with `LC_ALL=C`) says it would do.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AptPlan {
    /// Packages it would remove, with their installed version (`Remv`).
    pub removals: Vec<String>,
    /// Installed packages it would downgrade.
    pub downgrades: Vec<String>,
    /// Why it cannot install at all: unmet dependencies and `E:` lines.
    pub problems: Vec<String>,
}

impl AptPlan {
    /// Parses the simulation's output (stdout and stderr together).
    pub fn parse(out: &str) -> Self {
        let mut plan = AptPlan::default();
        let mut section = "";
        for line in out.lines() {
            if let Some(rest) = line.strip_prefix("Remv ") {
                plan.removals.push(rest.trim().to_string());
                continue;
            }
            if let Some(e) = line.strip_prefix("E: ") {
                plan.problems.push(e.trim().to_string());
                continue;
            }
            if !line.starts_with(' ') {
                section = if line.starts_with("The following packages will be DOWNGRADED") {
                    "downgraded"
                } else if line.starts_with("The following packages have unmet dependencies") {
                    "unmet"
                } else {
                    ""
                };
                continue;
            }
            match section {
                "downgraded" => plan.downgrades.extend(line.split_whitespace().map(String::from)),
                "unmet" => plan.problems.push(line.trim().to_string()),
                _ => {}
            }
        }
        plan
    }

    /// Why the install must not go ahead, as a message that names what is
    /// missing (`need`), the packages that would provide it, and what is in
    /// the way; `None` when it only adds (or upgrades) packages.
    pub fn refusal(&self, need: &str, packages: &[&str]) -> Option<String> {
        let pkgs = packages.join(" ");
        let mut why = Vec::new();
        if !self.removals.is_empty() {
            why.push(format!("remove {}", self.removals.join(", ")));
        }
        if !self.downgrades.is_empty() {
            why.push(format!("downgrade {}", self.downgrades.join(", ")));
        }
        if !why.is_empty() {
            return Some(format!(
                "{need} is missing; installing it (apt-get install {pkgs}) would {}. Nothing was changed. \
                 Resolve it yourself (e.g. install {pkgs} from the same release as the packages in the way, \
                 apt-get install -t <release> {pkgs}, or remove those you do not need), then run again.",
                why.join(" and ")
            ));
        }
        if !self.problems.is_empty() {
            return Some(format!(
                "{need} is missing and apt-get cannot install {pkgs}: {}. Nothing was changed.",
                self.problems.join("; ")
            ));
        }
        None
    }
}

/// Whether this process runs as root (else apt-get goes through sudo).
fn is_root() -> bool {
    Command::new("id").arg("-u").output().map(|o| o.stdout.starts_with(b"0")).unwrap_or(false)
}

/// Installs `packages`, which provide `need` (named in messages), with
/// apt-get as root (directly, or through sudo). First simulates the install
/// and refuses, changing nothing, when apt would remove or downgrade any
/// package to make room; the install itself runs with `--no-remove`.
pub fn apt_install(need: &str, packages: &[&str]) -> Result<()> {
    let root = is_root();
    let prefix = if root { "" } else { "sudo " };
    eprintln!("xtask: {need} is missing; apt-get install {}", packages.join(" "));
    let update = format!(
        "set -e; for i in $(seq 1 60); do {prefix}fuser /var/lib/dpkg/lock-frontend >/dev/null 2>&1 || break; sleep 5; done; \
         {prefix}apt-get update -qq"
    );
    let st = Command::new("sh").arg("-c").arg(update).status().map_err(|e| format!("apt-get: {e}"))?;
    if !st.success() {
        return Err(format!("{need} is missing and `apt-get update` failed; install {} yourself", packages.join(" ")));
    }
    let sim = Command::new("apt-get")
        .args(simulate_args(packages))
        .env("LC_ALL", "C")
        .output()
        .map_err(|e| format!("apt-get: {e}"))?;
    let out = format!("{}{}", String::from_utf8_lossy(&sim.stdout), String::from_utf8_lossy(&sim.stderr));
    let plan = AptPlan::parse(&out);
    if let Some(msg) = plan.refusal(need, packages) {
        return Err(msg);
    }
    if !sim.status.success() {
        return Err(format!(
            "{need} is missing and `apt-get -s install {}` failed:\n{}",
            packages.join(" "),
            out.trim()
        ));
    }
    let argv = install_command(packages, root);
    let st = Command::new(&argv[0]).args(&argv[1..]).status().map_err(|e| format!("{}: {e}", argv[0]))?;
    if !st.success() {
        return Err(format!(
            "{need} is missing and `apt-get install --no-remove {}` failed (see above); nothing was removed",
            packages.join(" ")
        ));
    }
    Ok(())
}

/// QEMU for aarch64 (Debian package qemu-system-arm).
pub fn ensure_qemu() -> Result<()> {
    if have("qemu-system-aarch64") {
        return Ok(());
    }
    apt_install("qemu-system-aarch64", &["qemu-system-arm", "ipxe-qemu"])?;
    if have("qemu-system-aarch64") {
        Ok(())
    } else {
        Err("qemu-system-aarch64 still missing after apt-get install".into())
    }
}

/// EDK2 for `--firmware uefi` (Debian's `qemu-efi-aarch64`).
pub fn ensure_edk2() -> Result<()> {
    if std::path::Path::new(crate::uefi::EDK2_FD).exists() {
        return Ok(());
    }
    apt_install("EDK2 (UEFI firmware for QEMU arm64)", &["qemu-efi-aarch64"])?;
    if std::path::Path::new(crate::uefi::EDK2_FD).exists() {
        Ok(())
    } else {
        Err(format!("{} still missing after apt-get install", crate::uefi::EDK2_FD))
    }
}

/// Tools the guest image builder uses (normally present on Debian).
pub fn ensure_image_tools() -> Result<()> {
    let missing: Vec<&str> = [("python3", "python3"), ("dpkg-deb", "dpkg"), ("cpio", "cpio")]
        .iter()
        .filter(|(cmd, _)| !have(cmd))
        .map(|(_, pkg)| *pkg)
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        apt_install("the guest image tools", &missing)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_install_never_removes_packages() {
        let a = install_args(&["qemu-system-arm", "ipxe-qemu"]);
        assert_eq!(a[0], "install");
        assert!(a.contains(&"--no-remove".to_string()), "{a:?}");
        // -y only ever together with --no-remove.
        assert!(a.contains(&"-y".to_string()));
        assert!(!a
            .iter()
            .any(|x| x == "--allow-downgrades" || x == "--allow-remove-essential" || x == "--auto-remove"));
        assert_eq!(&a[a.len() - 2..], ["qemu-system-arm", "ipxe-qemu"]);
        assert_eq!(install_command(&["cpio"], true)[..3], ["env", "DEBIAN_FRONTEND=noninteractive", "apt-get"]);
        let c = install_command(&["cpio"], false);
        assert_eq!(c[..4], ["sudo", "env", "DEBIAN_FRONTEND=noninteractive", "apt-get"]);
        assert_eq!(c[4..], install_args(&["cpio"])[..]);
        let s = simulate_args(&["qemu-system-arm"]);
        assert_eq!(s[..2], ["-s", "install"]);
        assert!(!s.contains(&"-y".to_string()));
    }

    // `LC_ALL=C apt-get -s install --no-install-recommends qemu-system-common=<older>`
    // on Debian 12 with qemu-system-arm installed: the shape of the qemu-utils
    // case (a qemu package in another version displaces the others).
    const REMOVES: &str = "Reading package lists...
Building dependency tree...
Reading state information...
The following packages will be REMOVED:
  qemu-system-arm
The following packages will be DOWNGRADED:
  qemu-system-common
0 upgraded, 0 newly installed, 1 downgraded, 1 to remove and 137 not upgraded.
Remv qemu-system-arm [1:7.2+dfsg-7+deb12u18+b3]
Inst qemu-system-common [1:7.2+dfsg-7+deb12u18+b3] (1:7.2+dfsg-7+deb12u15 Debian-Security:12/oldstable-security [amd64])
Conf qemu-system-common (1:7.2+dfsg-7+deb12u15 Debian-Security:12/oldstable-security [amd64])
";

    const UNMET: &str = "Reading state information...
Some packages could not be installed. This may mean that you have
requested an impossible situation or if you are using the unstable
distribution that some required packages have not yet been created
or been moved out of Incoming.
The following information may help to resolve the situation:

The following packages have unmet dependencies:
 qemu-system-arm : Depends: qemu-system-common (= 1:7.2+dfsg-7+deb12u15) but 1:7.2+dfsg-7+deb12u18+b3 is to be installed
E: Unable to correct problems, you have held broken packages.
";

    const CLEAN: &str = "The following NEW packages will be installed:
  qemu-utils
0 upgraded, 1 newly installed, 0 to remove and 137 not upgraded.
Inst qemu-utils (1:7.2+dfsg-7+deb12u15 Debian-Security:12/oldstable-security [amd64])
Conf qemu-utils (1:7.2+dfsg-7+deb12u15 Debian-Security:12/oldstable-security [amd64])
";

    #[test]
    fn a_simulated_removal_is_refused_naming_what_is_missing_and_what_conflicts() {
        let plan = AptPlan::parse(REMOVES);
        assert_eq!(plan.removals, ["qemu-system-arm [1:7.2+dfsg-7+deb12u18+b3]"]);
        assert_eq!(plan.downgrades, ["qemu-system-common"]);
        let msg = plan.refusal("qemu-system-aarch64", &["qemu-system-arm", "ipxe-qemu"]).expect("refused");
        assert!(msg.contains("qemu-system-aarch64 is missing"), "{msg}");
        assert!(msg.contains("remove qemu-system-arm [1:7.2"), "{msg}");
        assert!(msg.contains("downgrade qemu-system-common"), "{msg}");
        assert!(msg.contains("Nothing was changed"), "{msg}");
    }

    #[test]
    fn unmet_dependencies_are_reported_and_a_clean_install_goes_ahead() {
        let plan = AptPlan::parse(UNMET);
        assert!(plan.removals.is_empty());
        assert_eq!(plan.problems.len(), 2);
        let msg = plan.refusal("qemu-system-aarch64", &["qemu-system-arm"]).expect("refused");
        assert!(msg.contains("qemu-system-arm : Depends: qemu-system-common (= 1:7.2+dfsg-7+deb12u15)"), "{msg}");
        assert_eq!(AptPlan::parse(CLEAN), AptPlan::default());
        assert_eq!(AptPlan::parse(CLEAN).refusal("qemu-system-aarch64", &["qemu-utils"]), None);
    }
}
