//! Finding the record that fails every batch it is in: records one per transaction,
//! after [`ISOLATE_AFTER`](super::ISOLATE_AFTER) failed batches in a row, until the one refused for good (or
//! holding its transaction past the timeout) is found and handled per `on_error`.

use std::collections::BTreeSet;

use super::{Failed, Parts, Resync, recover};
use crate::Error;
use crate::engine::batch::dead_letters;
use crate::engine::seams::{Renew, Restore, Sink, Source};
use crate::kafka;
use crate::processor::Processor;

/// Runs `records` one per transaction, after batches failed in a row: the record that
/// fails alone, refused for good by the broker (too large, invalid for its topic) or
/// holding its transaction past the timeout, is the one that fails them all. It is
/// handled per `on_error` in a transaction of its own, and the partitions are rewound
/// to what is committed; the records after it come again with the next poll.
pub(in crate::engine) async fn isolate<S, K, P, R, N>(
    parts: &Parts<'_, S>,
    resync: &Resync<'_, R, N>,
    processor: &mut P,
    producer: &mut K,
    owned: &BTreeSet<i32>,
    records: Vec<kafka::Record>,
) -> Option<Failed>
where
    S: Source,
    K: Sink<S> + Send,
    P: Processor,
    R: Restore,
    N: Renew<K>,
{
    for record in records {
        let alone = parts
            .batch(&*producer)
            .run(processor, vec![record.clone()])
            .await;
        let Err(error) = alone else { continue };

        let class = match &error {
            e if e.is_rejection() => dead_letters::FailureClass::Rejected,
            Error::TransactionTimedOut { .. } => dead_letters::FailureClass::TransactionTimeout,
            _ => return Some(Failed::Batch(error)),
        };
        if let Err(stop) = recover(resync, parts.consumer, producer, owned, &error).await {
            return Some(Failed::Stop(stop));
        }
        if resync.rebalanced_meanwhile() {
            // The record's partition may be someone else's now: its transaction would be
            // refused. Whoever owns it next finds the record the same way.
            tracing::info!(%error, "rebalanced while recovering; the records come again");
            return Some(Failed::Isolated);
        }
        tracing::warn!(
            %error,
            %class,
            partition = record.partition,
            offset = record.offset,
            "found the record that fails its batches"
        );
        if let Err(stop) = parts
            .batch(&*producer)
            .fail_alone(&record, class, error)
            .await
        {
            return Some(Failed::Stop(stop));
        }
        let next = vec![(record.partition, Some(record.offset + 1))];
        if let Err(stop) = parts.consumer.seek(next).await {
            return Some(Failed::Stop(stop));
        }
        return Some(Failed::Isolated);
    }
    None
}
