//! The redb tables of the transaction log, and the translation of redb failures.
//!
//! Every key starts with the input partition, so each partition's rows of a table are one
//! contiguous range ([`partition_range`]), and clearing or scanning a partition never visits
//! another's rows.

use std::ops::Bound;
use std::path::Path;

use redb::TableDefinition;

use crate::Error;

/// `"format_version"` -> the [`super::FORMAT_VERSION`] the file was created with.
pub(super) const META: TableDefinition<'_, &str, u64> = TableDefinition::new("meta");
/// The key in [`META`] that holds the format version.
pub(super) const FORMAT_VERSION_KEY: &str = "format_version";
/// What the file was built from: `"changelog_topic_id"` -> the changelog's topic ID
/// (KIP-516), so a recreated changelog is told from the one the file mirrors.
pub(super) const SOURCE: TableDefinition<'_, &str, &str> = TableDefinition::new("source");
/// The key in [`SOURCE`] that holds the changelog's topic ID.
pub(super) const CHANGELOG_ID_KEY: &str = "changelog_topic_id";
/// (partition, event ID) -> (input offset, processed_at_ms).
pub(super) const PROCESSED: TableDefinition<'_, (i32, &str), (i64, i64)> =
    TableDefinition::new("processed");
/// (partition, processed_at_ms, row number) -> the IDs of the entries processed then: the
/// expiry index, oldest first (`expiry.rs`).
pub(super) const EXPIRY: TableDefinition<'_, (i32, i64, u32), &[u8]> =
    TableDefinition::new("expiry");
/// partition -> number of rows of [`PROCESSED`]; absent when zero.
pub(super) const PROCESSED_COUNT: TableDefinition<'_, i32, u64> =
    TableDefinition::new("processed_count");
/// (partition, user key) -> user value.
pub(super) const STATE: TableDefinition<'_, (i32, &[u8]), &[u8]> = TableDefinition::new("state");
/// partition -> number of rows of [`STATE`]; absent when zero. Lets `stats` avoid a scan.
pub(super) const STATE_COUNT: TableDefinition<'_, i32, u64> = TableDefinition::new("state_count");
/// partition -> next changelog offset to read.
pub(super) const CHECKPOINT: TableDefinition<'_, i32, i64> = TableDefinition::new("checkpoint");
/// partition -> (): present while the checkpoint was set by the engine's own committed
/// transaction, whose commit marker is then the one changelog offset right after it.
pub(super) const MARKER_FOLLOWS: TableDefinition<'_, i32, ()> =
    TableDefinition::new("marker_follows");
/// partition -> the input offset the applied batches reached (their progress records).
pub(super) const PROGRESS: TableDefinition<'_, i32, i64> = TableDefinition::new("progress");
/// partition -> when (ms since the epoch) the partition was last in step with its
/// changelog: every record past the checkpoint was written after then. Set by the apply
/// of the engine's own batch that moves the checkpoint, and at the end of a replay; a
/// replay's chunks leave it. A partition not in step for longer than the changelog keeps
/// tombstones may have missed deletions that compaction removed since (hole E of issue
/// 40): it is rebuilt. Absent (a file from before this table): not known to be in step.
pub(super) const IN_STEP: TableDefinition<'_, i32, i64> = TableDefinition::new("in_step");

/// The bounds covering every key of `partition`, given the smallest key of a partition.
///
/// The upper bound is the next partition's smallest key, or none for `i32::MAX`, since
/// `partition + 1` would overflow there.
pub(super) fn partition_range<T>(
    partition: i32,
    smallest: impl Fn(i32) -> T,
) -> (Bound<T>, Bound<T>) {
    let upper = match partition.checked_add(1) {
        Some(next) => Bound::Excluded(smallest(next)),
        None => Bound::Unbounded,
    };
    (Bound::Included(smallest(partition)), upper)
}

/// How a redb failure should be handled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Failure {
    /// The file is damaged, foreign or of another layout: rebuild it from the changelog.
    Unusable,
    /// Another process or handle holds the file.
    Locked,
    /// Anything else: the environment (disk, permissions) or a bug.
    Other,
}

/// Classifies a redb error.
pub(super) fn classify(err: &redb::Error) -> Failure {
    match err {
        redb::Error::DatabaseAlreadyOpen | redb::Error::LockProtocolMismatch => Failure::Locked,
        redb::Error::Corrupted(_)
        | redb::Error::UpgradeRequired(_)
        | redb::Error::TableTypeMismatch { .. }
        | redb::Error::TypeDefinitionChanged { .. }
        | redb::Error::TableIsMultimap(_)
        | redb::Error::TableIsNotMultimap(_) => Failure::Unusable,
        // redb reports a file that lacks its magic number as InvalidData.
        redb::Error::Io(io) if io.kind() == std::io::ErrorKind::InvalidData => Failure::Unusable,
        _ => Failure::Other,
    }
}

/// An [`Error::State`] for a redb failure while `doing` something with the file at `path`,
/// with what the operator should do about it.
pub(super) fn state_error(path: &Path, doing: &str, err: impl Into<redb::Error>) -> Error {
    let err = err.into();
    let advice = match (&err, classify(&err)) {
        (redb::Error::LockProtocolMismatch, _) => {
            "a process using another redb version has this file open; stop it before starting \
             this instance"
                .to_string()
        }
        (_, Failure::Locked) => "another onceflow instance holds this state directory; give each \
                                 instance its own --instance-id or state dir"
            .to_string(),
        (_, Failure::Unusable) => format!(
            "the transaction log is only a cache of the changelog: stop the instance and delete \
             {}, and it is rebuilt from the changelog on the next start",
            path.display()
        ),
        (redb::Error::Io(_), _) => {
            "check the free space and the permissions of the state directory".to_string()
        }
        (redb::Error::ValueTooLarge(_), _) => "a state value may be at most 3 GiB".to_string(),
        _ => "this is likely a bug in onceflow; please report it".to_string(),
    };
    Error::State {
        path: path.to_path_buf(),
        message: format!("{doing} failed: {err}; {advice}"),
        cause: Some(Box::new(err)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// redb's error stays the cause of a state error, beside the advice for the operator.
    #[test]
    fn a_state_error_keeps_redbs_error_as_its_cause() {
        let error = state_error(
            Path::new("/state/txlog.redb"),
            "opening",
            redb::Error::DatabaseAlreadyOpen,
        );
        let cause = std::error::Error::source(&error).expect("a cause");
        assert!(
            matches!(
                cause.downcast_ref::<redb::Error>(),
                Some(redb::Error::DatabaseAlreadyOpen)
            ),
            "{cause:?}"
        );
        assert!(error.is_fatal());
        assert!(
            error.to_string().contains("another onceflow instance"),
            "{error}"
        );
    }

    #[test]
    fn partition_ranges_do_not_overflow_and_exclude_the_next_partition() {
        assert_eq!(
            partition_range(3, |p| (p, 0)),
            (Bound::Included((3, 0)), Bound::Excluded((4, 0)))
        );
        assert_eq!(
            partition_range(i32::MAX, |p| p),
            (Bound::Included(i32::MAX), Bound::Unbounded)
        );
    }

    #[test]
    fn lock_and_damage_are_told_apart_from_other_failures() {
        assert_eq!(classify(&redb::Error::DatabaseAlreadyOpen), Failure::Locked);
        assert_eq!(
            classify(&redb::Error::Corrupted("x".into())),
            Failure::Unusable
        );
        let not_redb = std::io::Error::new(std::io::ErrorKind::InvalidData, "magic");
        assert_eq!(classify(&redb::Error::Io(not_redb)), Failure::Unusable);
        let denied = std::io::Error::new(std::io::ErrorKind::PermissionDenied, "no");
        assert_eq!(classify(&redb::Error::Io(denied)), Failure::Other);

        let locked = state_error(
            Path::new("/s/txlog.redb"),
            "opening",
            redb::Error::DatabaseAlreadyOpen,
        );
        let text = locked.to_string();
        assert!(text.contains("--instance-id"), "{text}");
        assert!(
            text.starts_with("state store at /s/txlog.redb: opening failed"),
            "{text}"
        );
    }
}
