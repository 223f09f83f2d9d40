//! Small text encodings the command lines share: base64 for the guest's
//! `guestcmd=` ([`crate::run::qemu`], [`crate::run::domu`]) and shell quoting for the
//! QEMU lines printed for a user to paste ([`crate::toolchain`]).

/// Base64 without padding issues (standard alphabet, '=' padded).
pub fn base64(data: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut s = String::new();
    for c in data.chunks(3) {
        let n = (c[0] as u32) << 16 | (*c.get(1).unwrap_or(&0) as u32) << 8 | *c.get(2).unwrap_or(&0) as u32;
        for i in 0..4 {
            if i <= c.len() {
                s.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                s.push('=');
            }
        }
    }
    s
}

fn shell_quote(s: &str) -> String {
    if s.chars().all(|c| c.is_ascii_alphanumeric() || "-_=.,/:+@".contains(c)) {
        s.into()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

/// The QEMU arguments the way a user can paste them (each after a space).
pub fn printable_args(args: &[String]) -> String {
    let mut s = String::new();
    for a in args {
        s.push(' ');
        s.push_str(&shell_quote(a));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_known_vectors() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"uname -m; nproc"), "dW5hbWUgLW07IG5wcm9j");
    }
}
