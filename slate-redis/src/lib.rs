//! slate-redis (work in progress).
