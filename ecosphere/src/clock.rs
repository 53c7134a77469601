//! clock (in progress).
