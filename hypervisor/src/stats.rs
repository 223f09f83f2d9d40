//! Per-vCPU counters and latency histograms (work in progress)
