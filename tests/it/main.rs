//! The integration tests: one binary (one link instead of one per file), one module per area,
//! named after the `src/` module it exercises (`sql` for `query`, `dist` for `dist`, ...).
//! Run one area with `cargo test --test it sql::`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

mod cli;
mod compat;
mod convert;
mod corruption;
mod crash;
mod dist;
mod errors;
mod faults;
mod hostile;
mod loader;
mod properties;
mod query;
mod roundtrip;
mod scale;
mod seams;
mod sql;
mod surfaces;
mod text;
mod zarr;
