//! The identifiers every layer shares.

/// A domain's number: Dom0 is 0, DomUs are 1, 2, … in device-tree order.
pub type DomainId = u16;
