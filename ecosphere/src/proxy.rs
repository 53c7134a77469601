//! proxy (in progress).
