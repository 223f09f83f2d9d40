//! Architecture support; every architecture exports the same names.
pub mod aarch64;
pub use aarch64::*;
