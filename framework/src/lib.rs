//! # onceflow
//!
//! Kafka stream processors whose effects happen exactly once: each batch of input is
//! processed in one Kafka transaction, in which outputs, changelog entries and consumer
//! offsets commit together, and each operator keeps a durable log of the event IDs it
//! processed so that duplicates from upstream are skipped even after a restart.
//!
//! This release holds the foundation the engine is built on:
//!
//! - [`Error`], the one error type of the crate, which tells its caller whether a failure is
//!   worth retrying, needs the open transaction aborted, or is fatal;
//! - [`testkit`] (feature `testkit`): a real Apache Kafka broker for tests, started with
//!   testcontainers, and helpers to create topics, produce, read a topic to its end under
//!   `read_committed` or `read_uncommitted`, and read a group's committed offsets.
//!
//! The precise guarantee and the architecture are in `DESIGN.md` of the repository.
#![deny(missing_docs)]
#![cfg_attr(docsrs, feature(doc_auto_cfg))]

mod error;
mod kafka;

#[cfg(feature = "testkit")]
pub mod testkit;

pub use error::{Error, Result};
