//! slate-aqs (work in progress).
