//! Derive macros for onceflow: `#[derive(Event)]` and `#[derive(Processor)]`.
//!
//! The derives arrive with the engine's `Processor` and `Event` traits; this crate is a
//! workspace member now so the build, lints and CI cover it from the start.
