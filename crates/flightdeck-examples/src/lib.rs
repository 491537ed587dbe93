//! flightdeck's larger examples and their tests: nothing to depend on.
//!
//! ```text
//! cargo run -p flightdeck-examples --example axum      # an axum service (Redis optional)
//! cargo run -p flightdeck-examples --example tonic     # a tonic service (Redis optional)
//! cargo run -p flightdeck-examples --release --example loadgen -- --fault
//! cargo run -p flightdeck-examples --release --example mode_overhead
//! ```
//!
//! They live in a package of their own so that the root package's
//! `cargo run --example quickstart` builds only what the quickstart uses.

/// The README's snippets, compiled by `cargo test --doc -p
/// flightdeck-examples`: here, since the tonic snippet needs tonic, which
/// the root package's quickstart must not build.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeSnippets;
