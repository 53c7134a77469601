//! Slate's benchmarks: criterion benches (`benches/`) and the side-by-side contention runner
//! ([`contention`], binary `contention`). Results go to `docs/BENCHMARKS.md`; nothing here is
//! asserted in tests.

pub mod contention;
