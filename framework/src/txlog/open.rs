//! Opening the transaction log, and replacing a file that cannot be used.
//!
//! The file is a cache of the changelog, so a file redb rejects as damaged, or one of
//! another layout, is not worth repairing by hand: it is moved aside (kept, for a post-mortem)
//! and a new one is created, which the engine fills by replaying the changelog. A file that
//! is merely locked is different: another instance is using it, and replacing it under that
//! instance would break exactly-once, so that is an error.

use std::any::Any;
use std::fs;
use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use redb::{Builder, Database, Durability, ReadableTable, TableHandle};

use super::tables::{
    CHECKPOINT, EXPIRY, FORMAT_VERSION_KEY, Failure, IN_STEP, MARKER_FOLLOWS, META, PROCESSED,
    PROCESSED_COUNT, PROGRESS, SOURCE, STATE, STATE_COUNT, classify, state_error,
};
use super::{FORMAT_VERSION, Opened, TXLOG_FILE, TxLog};
use crate::{Error, Result};

/// The page cache of the log unless configured otherwise. redb's own default, 1 GiB, is
/// memory the process keeps: the cache fills with the pages batches read and write and
/// does not shrink, so the benchmark's contender grew with its dedup log (peak RSS 195.5
/// MiB with 1 M IDs, 409.4 MiB with 3 M). At 16 MiB the same runs peaked at 105.1 and
/// 112.0 MiB, with throughput and a cold restore's replay rate within the runs' spread:
/// pages outside the cache come from the operating system's page cache, which gives
/// memory back.
/// (bench/results/2026-12-05-txlog-cache.md)
pub(crate) const DEFAULT_CACHE_SIZE: usize = 16 << 20;

impl TxLog {
    /// [`TxLog::open_with_cache`] with the default cache ([`DEFAULT_CACHE_SIZE`]).
    #[cfg(any(test, feature = "bench-internals"))]
    pub(crate) fn open(dir: &Path) -> Result<(TxLog, Opened)> {
        TxLog::open_with_cache(dir, DEFAULT_CACHE_SIZE)
    }

    /// Opens or creates `dir/txlog.redb` (creating `dir` with mode 0700), with a page cache
    /// of `cache_size` bytes ([`crate::EngineConfig::txlog_cache_size`]). A file that redb
    /// cannot open because it is corrupt, or whose stored format version is not
    /// FORMAT_VERSION, is moved aside to `txlog.redb.corrupt-<unix secs>` and a fresh one is
    /// created: Opened::Rebuilt{reason} (the engine then replays the changelog from the
    /// beginning and logs the reason). A file locked by another process (redb's
    /// DatabaseAlreadyOpen) is an Error::State, NOT a rebuild.
    pub(crate) fn open_with_cache(dir: &Path, cache_size: usize) -> Result<(TxLog, Opened)> {
        create_state_dir(dir)?;
        check_private(dir)?;
        let path = dir.join(TXLOG_FILE);
        let reason = match attempt(&path, cache_size)? {
            Attempt::Ready { db, initialized } => {
                let opened = if initialized {
                    Opened::Fresh
                } else {
                    Opened::Existing
                };
                return Ok((TxLog::new(db, path, cache_size), opened));
            }
            Attempt::Unusable(reason) => reason,
        };
        let aside = move_aside(&path)?;
        let reason = format!("{reason}; the old file was moved to {}", aside.display());
        tracing::warn!(path = %path.display(), %reason, "rebuilding the transaction log");
        match attempt(&path, cache_size)? {
            Attempt::Ready { db, .. } => {
                Ok((TxLog::new(db, path, cache_size), Opened::Rebuilt { reason }))
            }
            Attempt::Unusable(again) => Err(Error::State {
                path,
                message: format!(
                    "a new transaction log is unusable too ({again}) after the old one was \
                     ({reason}); check the disk and the state directory"
                ),
                cause: None,
            }),
        }
    }
}

impl TxLog {
    /// Opens an existing `dir/txlog.redb` to read it (for `inspect`): nothing is created,
    /// moved aside or repaired, and a file in use by a running instance is refused.
    #[cfg(feature = "runner")]
    pub(crate) fn open_read_only(dir: &Path) -> Result<TxLog> {
        let path = dir.join(TXLOG_FILE);
        if !path.exists() {
            return Err(Error::State {
                path,
                message: "no transaction log here: check state_dir, group and instance_id \
                          (the log is <state_dir>/<group>/<instance_id>/txlog.redb)"
                    .into(),
                cause: None,
            });
        }
        // `inspect` reads each table once and keeps nothing: the engine's default cache is plenty.
        let opened = panic::catch_unwind(AssertUnwindSafe(|| {
            Builder::new()
                .set_cache_size(DEFAULT_CACHE_SIZE)
                .open(&path)
        }));
        match opened {
            Ok(Ok(db)) => Ok(TxLog::new(db, path, DEFAULT_CACHE_SIZE)),
            Ok(Err(err)) => match redb::Error::from(err) {
                err if matches!(classify(&err), Failure::Locked) => Err(Error::State {
                    path,
                    message: "the file is in use: stop the instance first (or inspect a copy)"
                        .into(),
                    cause: Some(Box::new(err)),
                }),
                err => Err(Error::State {
                    path,
                    message: format!(
                        "redb cannot read it ({err}); the engine will move it aside and \
                         rebuild it from the changelog at its next start"
                    ),
                    cause: Some(Box::new(err)),
                }),
            },
            Err(payload) => Err(Error::State {
                path,
                message: format!(
                    "redb panicked reading it ({}); the engine will rebuild it at its next start",
                    panic_message(payload.as_ref())
                ),
                cause: None,
            }),
        }
    }
}

/// The outcome of one try at opening the file.
enum Attempt {
    /// Open, with the current format.
    Ready {
        /// The open file.
        db: Database,
        /// Whether the file was new (or empty) and its format was written just now.
        initialized: bool,
    },
    /// The file must be rebuilt, for this reason. It is closed.
    Unusable(String),
}

/// Opens `path` with redb, with a page cache of `cache_size` bytes, and checks its format.
fn attempt(path: &Path, cache_size: usize) -> Result<Attempt> {
    let doing = "opening the transaction log";
    let mut builder = Builder::new();
    // A plain open trusts a cleanly closed file and may panic on one damaged since; the
    // check (a read of the whole file) reports the damage as an error instead.
    builder.set_check_integrity_on_open(true);
    builder.set_cache_size(cache_size);
    // The catch is the last line of defence for "never panic on bad data": whatever redb
    // does with a damaged file, the outcome is a rebuild, not a crash loop.
    let opened = panic::catch_unwind(AssertUnwindSafe(|| {
        let db = builder.create(path)?;
        let format = check_format(&db)?;
        Ok::<_, redb::Error>((db, format))
    }));
    match opened {
        Ok(Ok((db, Format::Current { initialized }))) => Ok(Attempt::Ready { db, initialized }),
        // The database is dropped, and so closed, before the caller moves the file.
        Ok(Ok((_, Format::Other(reason)))) => Ok(Attempt::Unusable(reason)),
        Ok(Err(err)) => match classify(&err) {
            Failure::Unusable => Ok(Attempt::Unusable(format!("redb cannot use it: {err}"))),
            Failure::Locked | Failure::Other => Err(state_error(path, doing, err)),
        },
        Err(payload) => Ok(Attempt::Unusable(format!(
            "redb panicked opening it: {}",
            panic_message(payload.as_ref())
        ))),
    }
}

/// What [`check_format`] found.
enum Format {
    /// Ours and current; `initialized` when the file was empty and the version just written.
    Current {
        /// Whether the format version was written just now.
        initialized: bool,
    },
    /// Not ours, or of another format version, for this reason.
    Other(String),
}

/// Checks the stored format version, writing it into a file that has no tables yet, and
/// creates the tables, so that read transactions never find one missing.
fn check_format(db: &Database) -> std::result::Result<Format, redb::Error> {
    let mut txn = db.begin_write()?;
    let existing: Vec<String> = txn.list_tables()?.map(|t| t.name().to_string()).collect();
    let initialized = {
        let mut meta = txn.open_table(META)?;
        let stored = meta.get(FORMAT_VERSION_KEY)?.map(|guard| guard.value());
        match stored {
            Some(version) if version == u64::from(FORMAT_VERSION) => false,
            Some(version) => {
                return Ok(Format::Other(format!(
                    "it holds format version {version}, this build reads version {FORMAT_VERSION}"
                )));
            }
            None if existing.is_empty() => {
                meta.insert(FORMAT_VERSION_KEY, u64::from(FORMAT_VERSION))?;
                true
            }
            None => {
                return Ok(Format::Other(format!(
                    "it has tables ({}) but no format version",
                    existing.join(", ")
                )));
            }
        }
    };
    // Opening checks each table's key and value types against the stored ones.
    txn.open_table(PROCESSED)?;
    txn.open_table(EXPIRY)?;
    txn.open_table(PROCESSED_COUNT)?;
    txn.open_table(STATE)?;
    txn.open_table(STATE_COUNT)?;
    txn.open_table(CHECKPOINT)?;
    // Added after format version 1 was released: opening creates them in older files.
    txn.open_table(MARKER_FOLLOWS)?;
    txn.open_table(PROGRESS)?;
    txn.open_table(SOURCE)?;
    txn.open_table(IN_STEP)?;
    txn.set_durability(Durability::Immediate)?;
    txn.commit()?;
    Ok(Format::Current { initialized })
}

/// Creates the state directory, private to its owner: the log holds the users' state.
fn create_state_dir(dir: &Path) -> Result<()> {
    let mut builder = fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        builder.mode(0o700);
    }
    builder.create(dir).map_err(|e| Error::State {
        path: dir.to_path_buf(),
        message: format!(
            "creating the state directory failed: {e}; check that its parent is writable or \
             choose another state dir"
        ),
        cause: Some(Box::new(e)),
    })
}

/// Refuses a directory another user owns, or that others may write to: whoever can
/// write there can replace the transaction log, and with it what the instance believes it
/// processed. (Reading is the owner's choice; onceflow creates it 0700.)
pub(crate) fn check_private(dir: &Path) -> Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        let metadata = fs::metadata(dir).map_err(|e| Error::State {
            path: dir.to_path_buf(),
            message: format!("cannot read the state directory's owner and mode: {e}"),
            cause: Some(Box::new(e)),
        })?;
        let me = rustix::process::geteuid().as_raw();
        let mode = metadata.mode() & 0o7777;
        if metadata.uid() != me {
            return Err(Error::State {
                path: dir.to_path_buf(),
                message: format!(
                    "the state directory is owned by uid {} (mode {mode:04o}), not by this \
                     process's uid {me}; refusing to use it: run as its owner, or `chown {me}` \
                     it, or choose another state dir",
                    metadata.uid()
                ),
                cause: None,
            });
        }
        if mode & 0o022 != 0 {
            return Err(Error::State {
                path: dir.to_path_buf(),
                message: format!(
                    "the state directory is writable by {} (mode {mode:04o}); refusing to use \
                     it: `chmod go-w` it (onceflow creates it 0700) or choose another state dir",
                    if mode & 0o002 != 0 {
                        "everyone"
                    } else {
                        "its group"
                    }
                ),
                cause: None,
            });
        }
    }
    Ok(())
}

/// Renames the unusable file to `txlog.redb.corrupt-<unix secs>` (with a `-<n>` suffix if
/// that exists), keeping it for a post-mortem; returns the new path.
fn move_aside(path: &Path) -> Result<PathBuf> {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_secs());
    let base = format!("{TXLOG_FILE}.corrupt-{secs}");
    let mut aside = path.with_file_name(&base);
    let mut n = 1u32;
    while aside.exists() {
        aside = path.with_file_name(format!("{base}-{n}"));
        n += 1;
    }
    fs::rename(path, &aside).map_err(|e| Error::State {
        path: path.to_path_buf(),
        message: format!(
            "moving the unusable transaction log aside to {} failed: {e}; move or delete it by \
             hand and restart",
            aside.display()
        ),
        cause: Some(Box::new(e)),
    })?;
    Ok(aside)
}

/// The message of a caught panic.
fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(text) = payload.downcast_ref::<&str>() {
        (*text).to_string()
    } else if let Some(text) = payload.downcast_ref::<String>() {
        text.clone()
    } else {
        "(no message)".to_string()
    }
}

#[cfg(test)]
mod tests {
    use redb::TableDefinition;

    use super::*;
    use crate::txlog::Change;

    fn corrupt_files(dir: &Path) -> Vec<PathBuf> {
        let mut found: Vec<PathBuf> = fs::read_dir(dir)
            .expect("read dir")
            .map(|entry| entry.expect("entry").path())
            .filter(|path| {
                path.file_name()
                    .and_then(|name| name.to_str())
                    .is_some_and(|name| name.starts_with("txlog.redb.corrupt-"))
            })
            .collect();
        found.sort();
        found
    }

    fn write_something(log: &TxLog) {
        let change = Change::Processed {
            id: "a".into(),
            offset: 1,
            processed_at_ms: 2,
        };
        log.apply(&[(0, vec![change], Some(2))]).expect("apply");
    }

    #[test]
    fn a_new_directory_is_created_private_and_fresh() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("a").join("b");
        let (log, opened) = TxLog::open(&dir).unwrap();
        assert_eq!(opened, Opened::Fresh);
        assert_eq!(log.path(), dir.join(TXLOG_FILE));
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = fs::metadata(&dir).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o700);
        }
    }

    #[test]
    fn reopening_keeps_the_data() {
        let dir = tempfile::tempdir().unwrap();
        let (log, _) = TxLog::open(dir.path()).unwrap();
        write_something(&log);
        drop(log);
        let (log, opened) = TxLog::open(dir.path()).unwrap();
        assert_eq!(opened, Opened::Existing);
        assert!(log.is_processed(0, "a").unwrap());
        assert_eq!(log.checkpoint(0).unwrap(), Some(2));
        assert!(corrupt_files(dir.path()).is_empty());
    }

    #[test]
    fn an_empty_file_is_fresh() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join(TXLOG_FILE), b"").unwrap();
        let (_log, opened) = TxLog::open(dir.path()).unwrap();
        assert_eq!(opened, Opened::Fresh);
    }

    #[test]
    fn a_garbage_file_is_moved_aside_and_rebuilt() {
        let dir = tempfile::tempdir().unwrap();
        let garbage = b"this is not a redb file, just some bytes".repeat(200);
        fs::write(dir.path().join(TXLOG_FILE), &garbage).unwrap();

        let (log, opened) = TxLog::open(dir.path()).unwrap();
        let Opened::Rebuilt { reason } = opened else {
            panic!("expected a rebuild, got {opened:?}");
        };
        let aside = corrupt_files(dir.path());
        assert_eq!(aside.len(), 1, "{aside:?}");
        assert_eq!(
            fs::read(&aside[0]).unwrap(),
            garbage,
            "the old file is kept as it was"
        );
        assert!(reason.contains(&aside[0].display().to_string()), "{reason}");

        // The new file works and is ours from now on.
        write_something(&log);
        drop(log);
        let (_log, opened) = TxLog::open(dir.path()).unwrap();
        assert_eq!(opened, Opened::Existing);
    }

    #[test]
    fn a_damaged_file_is_rebuilt_and_never_panics() {
        let dir = tempfile::tempdir().unwrap();
        let (log, _) = TxLog::open(dir.path()).unwrap();
        write_something(&log);
        drop(log);
        // Keep redb's header (so it is recognised as a redb file) and scramble the rest.
        let path = dir.path().join(TXLOG_FILE);
        let mut bytes = fs::read(&path).unwrap();
        for (n, byte) in bytes.iter_mut().enumerate().skip(4096) {
            *byte = (n % 251) as u8;
        }
        fs::write(&path, &bytes).unwrap();

        let (log, opened) = TxLog::open(dir.path()).unwrap();
        assert!(matches!(opened, Opened::Rebuilt { .. }), "{opened:?}");
        assert!(!log.is_processed(0, "a").unwrap());
        assert_eq!(corrupt_files(dir.path()).len(), 1);
    }

    /// Creates a redb file at `path` whose meta table holds format `version`, with what
    /// `more` writes in the same transaction.
    fn file_of_version(path: &Path, version: u64, more: impl FnOnce(&redb::WriteTransaction)) {
        let db = Database::create(path).unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_table(META)
            .unwrap()
            .insert(FORMAT_VERSION_KEY, version)
            .unwrap();
        more(&txn);
        txn.commit().unwrap();
    }

    /// An older build's file (version 1 had a row per entry in the expiry index) and a
    /// newer build's are both rebuilt from the changelog.
    #[test]
    fn another_format_version_is_rebuilt() {
        for version in [1, u64::from(FORMAT_VERSION) + 1] {
            let dir = tempfile::tempdir().unwrap();
            file_of_version(&dir.path().join(TXLOG_FILE), version, |_| {});
            let (_log, opened) = TxLog::open(dir.path()).unwrap();
            let Opened::Rebuilt { reason } = opened else {
                panic!("expected a rebuild of version {version}, got {opened:?}");
            };
            assert!(
                reason.contains(&format!("format version {version}")),
                "{reason}"
            );
            assert_eq!(corrupt_files(dir.path()).len(), 1);
        }
    }

    #[test]
    fn a_foreign_redb_file_is_rebuilt() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(TXLOG_FILE);
        {
            let db = Database::create(&path).unwrap();
            let txn = db.begin_write().unwrap();
            let other: TableDefinition<'_, u64, u64> = TableDefinition::new("someone_else");
            txn.open_table(other).unwrap().insert(1, 2).unwrap();
            // A table of ours with other types, as a different layout would have.
            let processed: TableDefinition<'_, u64, u64> = TableDefinition::new("processed");
            txn.open_table(processed).unwrap().insert(1, 2).unwrap();
            txn.commit().unwrap();
        }
        let (_log, opened) = TxLog::open(dir.path()).unwrap();
        let Opened::Rebuilt { reason } = opened else {
            panic!("expected a rebuild, got {opened:?}");
        };
        assert!(reason.contains("no format version"), "{reason}");
    }

    #[test]
    fn a_table_of_another_type_is_rebuilt() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(TXLOG_FILE);
        file_of_version(&path, u64::from(FORMAT_VERSION), |txn| {
            let processed: TableDefinition<'_, u64, u64> = TableDefinition::new("processed");
            txn.open_table(processed).unwrap().insert(1, 2).unwrap();
        });
        let (_log, opened) = TxLog::open(dir.path()).unwrap();
        assert!(matches!(opened, Opened::Rebuilt { .. }), "{opened:?}");
    }

    #[test]
    fn a_file_in_use_is_an_error_not_a_rebuild() {
        let dir = tempfile::tempdir().unwrap();
        let (first, _) = TxLog::open(dir.path()).unwrap();
        write_something(&first);
        let err = TxLog::open(dir.path()).unwrap_err();
        let Error::State { path, message, .. } = &err else {
            panic!("expected Error::State, got {err:?}");
        };
        assert_eq!(path, &dir.path().join(TXLOG_FILE));
        assert!(message.contains("another onceflow instance"), "{message}");
        assert!(
            corrupt_files(dir.path()).is_empty(),
            "nothing was moved aside"
        );
        // The first handle is unaffected.
        assert!(first.is_processed(0, "a").unwrap());
        drop(first);
        let (_log, opened) = TxLog::open(dir.path()).unwrap();
        assert_eq!(opened, Opened::Existing);
    }

    #[cfg(unix)]
    #[test]
    fn a_state_dir_others_may_write_to_is_refused_with_its_mode() {
        use std::os::unix::fs::PermissionsExt;
        let root = tempfile::tempdir().unwrap();
        for (mode, who) in [(0o777, "everyone"), (0o770, "its group")] {
            let dir = root.path().join(format!("{mode:o}"));
            fs::create_dir(&dir).unwrap();
            fs::set_permissions(&dir, fs::Permissions::from_mode(mode)).unwrap();
            let err = TxLog::open(&dir).unwrap_err();
            let text = err.to_string();
            assert!(matches!(err, Error::State { .. }), "{text}");
            assert!(
                text.contains(who) && text.contains(&format!("{mode:04o}")),
                "{text}"
            );
            assert!(text.contains(&dir.display().to_string()), "{text}");
            assert!(!dir.join(TXLOG_FILE).exists(), "nothing is created in it");
        }
        let readable = root.path().join("readable");
        fs::create_dir(&readable).unwrap();
        fs::set_permissions(&readable, fs::Permissions::from_mode(0o755)).unwrap();
        TxLog::open(&readable).expect("readable by others is the owner's choice");
    }

    #[cfg(unix)]
    #[test]
    fn a_state_dir_owned_by_another_user_is_refused() {
        use std::os::unix::fs::MetadataExt;
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("theirs");
        fs::create_dir(&dir).unwrap();
        let me = rustix::process::geteuid().as_raw();
        // Only root can give a directory away; elsewhere the check is still exercised
        // through a directory that exists and belongs to someone else, if any.
        let other = if me == 0 {
            let status = std::process::Command::new("chown")
                .args(["4242", dir.to_str().unwrap()])
                .status()
                .expect("chown runs");
            assert!(status.success());
            dir.clone()
        } else {
            let root_owned = Path::new("/");
            assert_ne!(fs::metadata(root_owned).unwrap().uid(), me);
            root_owned.to_path_buf()
        };
        let err = check_private(&other).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("owned by uid") && text.contains(&format!("uid {me}")),
            "{text}"
        );
        if me == 0 {
            let err = TxLog::open(&dir).unwrap_err();
            assert!(err.to_string().contains("owned by uid 4242"), "{err}");
        }
    }

    #[test]
    fn a_state_dir_that_is_a_file_is_an_error() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("state");
        fs::write(&dir, b"not a directory").unwrap();
        let err = TxLog::open(&dir).unwrap_err();
        assert!(matches!(err, Error::State { .. }), "{err:?}");
    }
}
