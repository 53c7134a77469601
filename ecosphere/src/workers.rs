//! workers (in progress).
