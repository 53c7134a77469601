//! slate-core (work in progress).
