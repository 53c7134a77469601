//! benches (work in progress).
