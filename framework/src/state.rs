//! Where a record's state lives: the seam between what a processor reads and writes
//! through its [`Context`](crate::Context) and the stores that keep it.
//!
//! The engine's store is the transaction log's layered read (`txlog::Layers`: the
//! record's own writes over the batch's over the committed log), so a failed attempt
//! leaves nothing behind; timers keep their entries through the same seam. This module
//! imports nothing of the crate but the error type, so the user API, the timers and the
//! transaction log can all stand on it.

use crate::error::Result;

/// Where a record's state lives while it is processed. The engine's is the transaction
/// log's layered read (`txlog::Layers`: the record's own writes over the batch's over the
/// committed log), so a failed attempt leaves nothing behind; `State` knows only this.
pub(crate) trait StateStore: Send {
    /// The value of `key` in `partition`, as the record sees it.
    fn get(&self, partition: i32, key: &[u8]) -> Result<Option<Vec<u8>>>;
    /// Sets `key` of `partition` to `value`.
    fn put(&mut self, partition: i32, key: Vec<u8>, value: Vec<u8>);
    /// Deletes `key` of `partition`.
    fn delete(&mut self, partition: i32, key: Vec<u8>);
}
