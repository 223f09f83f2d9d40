//! The checks on the tree itself:
//!
//! - [`lint`]: rustfmt, clippy and rustdoc (warnings as errors), run by `cargo xtask test`
//! - [`deps`]: `cargo xtask deps`: the module graph of a crate read from its
//!   source, and the circles among sibling modules
//! - `arch_doc` (tests only): keeps docs/ARCHITECTURE.md, README's
//!   architecture section and the module lists true to the tree
//! - `source_rules` (tests only): no function over 120 lines, no issue
//!   numbers in comments

pub mod deps;
pub mod lint;

#[cfg(test)]
mod arch_doc;
#[cfg(test)]
mod source_rules;
