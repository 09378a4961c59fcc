//! onceflow side by side with raw rdkafka and Kafka Streams exactly-once (issue 6).
//!
//! The binary `onceflow-bench` is the driver (`report`), the load generator (`produce`)
//! and the Rust contenders (`raw`, `raw-txn`, `onceflow`); the Kafka Streams contender is
//! the Maven project in `bench/streams/`, the Rust peers are the cargo projects in
//! `bench/peers/`. README.md, section "Benchmark", says how to run it and what is measured.

pub mod charts;
pub mod driver;
pub mod effects;
pub mod flow;
pub mod peers;
pub mod process;
pub mod raw;
pub mod report;
pub mod workload;
