//! slate-combination (work in progress).
