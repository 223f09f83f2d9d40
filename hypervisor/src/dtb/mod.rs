//! dtb (work in progress)
