//! The examples' driver tests: each example file is included here as a module, so its
//! `#[cfg(test)] mod tests` runs with `cargo test` while `cargo test` still builds the
//! example itself as the binary the broker tests start (see `Cargo.toml`).
//!
//! Each module's `main` and the items only `main` uses are dead code here.

#[allow(dead_code, unreachable_pub)]
#[path = "../examples/bank_transfer.rs"]
mod bank_transfer;

#[allow(dead_code, unreachable_pub)]
#[path = "../examples/billing.rs"]
mod billing;

#[allow(dead_code, unreachable_pub)]
#[path = "../examples/fraud_check.rs"]
mod fraud_check;

#[allow(dead_code, unreachable_pub)]
#[path = "../examples/payments.rs"]
mod payments;

#[allow(dead_code, unreachable_pub)]
#[path = "../examples/shop/domain.rs"]
mod shop_domain;

#[allow(dead_code, unreachable_pub)]
#[path = "../examples/word_count.rs"]
mod word_count;
