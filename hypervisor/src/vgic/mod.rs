//! vgic (work in progress)
