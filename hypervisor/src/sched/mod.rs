//! sched (work in progress)
