//! The facade's integration tests that need Redis, the test harness,
//! proptest or a metrics registry (`tests/`): a package of their own, as
//! tokio's `tests-integration`, so that `cargo run --example quickstart`
//! in the root package builds none of their dependencies. The tests that
//! only need the facade (the README's and quickstart's code, the docs,
//! the configuration) stay in the root package. Nothing here is a library.
