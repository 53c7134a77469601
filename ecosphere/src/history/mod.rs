//! history (in progress).
