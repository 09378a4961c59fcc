//! Runnable onceflow processors users can copy, each one file under `examples/`:
//!
//! - `billing`: orders in, invoices out, with a running total per customer;
//! - `bank_transfer`: transfer requests in, debit and credit entries out, balances in state;
//! - `word_count`: lines in, a running count per word out;
//! - `quickstart`: starts Kafka, runs `billing` through a crash and checks the result.
//!
//! Run one with `cargo run --example billing -- --help`. Their end-to-end tests are in
//! `tests/`.
