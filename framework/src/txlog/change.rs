//! [`Change`] and its changelog record encoding.
//!
//! The changelog is compacted, so the encoding maps every change to the key it overwrites:
//! a dedup entry's processing and its expiry share the key `e:<id>`, a state write and its
//! deletion share `s:<key>`, and every batch's progress record shares `p:` (one key per
//! changelog partition). Whatever compaction keeps, the last record per key, is then
//! exactly what applying every record in order would have left.

use std::fmt;

use crate::{Error, Result};

use crate::wire::{
    CHANGELOG_EVENT_PREFIX as EVENT_PREFIX, CHANGELOG_PROGRESS_KEY as PROGRESS_KEY,
    CHANGELOG_STATE_PREFIX as STATE_PREFIX,
};
/// First byte of a `Progress` value.
const PROGRESS_VERSION: u8 = 1;
/// First byte of a `Processed` value, so that the value layout can change later.
const PROCESSED_VERSION: u8 = 1;
/// Length of a `Processed` value: version byte, offset, processed_at_ms.
const PROCESSED_LEN: usize = 1 + 8 + 8;

/// One change a batch made to one input partition; written to the changelog and applied to redb.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Change {
    /// Event `id` was processed (input offset, wall-clock ms when processed).
    Processed {
        /// The event's ID.
        id: String,
        /// Offset of the event in its input partition.
        offset: i64,
        /// Wall-clock time when it was processed, in ms since the Unix epoch.
        processed_at_ms: i64,
    },
    /// The dedup entry `id` expired (a changelog tombstone).
    Expired {
        /// The event's ID.
        id: String,
    },
    /// State `key` set to `value`; `None` deletes it (a changelog tombstone).
    State {
        /// The user's key.
        key: Vec<u8>,
        /// The new value, or `None` for a deletion.
        value: Option<Vec<u8>>,
    },
    /// The batches up to this record processed the input partition up to (not including)
    /// `input_offset`: what the group commits with the batch. Replay compares it with the
    /// group's committed offset to know that it has seen every committed batch.
    Progress {
        /// The next input offset to process.
        input_offset: i64,
    },
}

impl Change {
    /// The changelog record's key and value (`None` value = tombstone).
    pub(crate) fn encode(&self) -> (Vec<u8>, Option<Vec<u8>>) {
        match self {
            Change::Processed {
                id,
                offset,
                processed_at_ms,
            } => {
                let mut value = Vec::with_capacity(PROCESSED_LEN);
                value.push(PROCESSED_VERSION);
                value.extend_from_slice(&offset.to_be_bytes());
                value.extend_from_slice(&processed_at_ms.to_be_bytes());
                (prefixed(EVENT_PREFIX, id.as_bytes()), Some(value))
            }
            Change::Expired { id } => (prefixed(EVENT_PREFIX, id.as_bytes()), None),
            Change::State { key, value } => (prefixed(STATE_PREFIX, key), value.clone()),
            Change::Progress { input_offset } => {
                let mut value = Vec::with_capacity(9);
                value.push(PROGRESS_VERSION);
                value.extend_from_slice(&input_offset.to_be_bytes());
                (PROGRESS_KEY.to_vec(), Some(value))
            }
        }
    }

    /// The size of the record [`Change::encode`] makes (key and value), without making it:
    /// the engine checks it against the changelog's limit for every write of every record.
    pub(crate) fn encoded_len(&self) -> usize {
        match self {
            Change::Processed { id, .. } => Self::dedup_entry_len(id),
            Change::Expired { id } => EVENT_PREFIX.len() + id.len(),
            Change::State { key, value } => {
                STATE_PREFIX.len() + key.len() + value.as_ref().map_or(0, Vec::len)
            }
            Change::Progress { .. } => PROGRESS_KEY.len() + 9,
        }
    }

    /// The size of the dedup entry of event `id`.
    pub(crate) fn dedup_entry_len(id: &str) -> usize {
        EVENT_PREFIX.len() + id.len() + PROCESSED_LEN
    }

    /// Inverse of `encode`. `what` names the record for errors (e.g. "changelog record
    /// orders-txlog/2@118"); it is formatted only when the record is malformed, so a replay
    /// of millions of records pays for no name it does not print.
    pub(crate) fn decode(
        key: &[u8],
        value: Option<&[u8]>,
        what: impl fmt::Display,
    ) -> Result<Change> {
        let corrupt = |message: String| Error::Corrupt {
            what: what.to_string(),
            message,
            cause: None,
        };
        if let Some(id) = key.strip_prefix(EVENT_PREFIX) {
            let id = std::str::from_utf8(id)
                .map_err(|e| corrupt(format!("event ID is not UTF-8: {e}")))?
                .to_string();
            let Some(value) = value else {
                return Ok(Change::Expired { id });
            };
            let (offset, processed_at_ms) = decode_processed(value).map_err(corrupt)?;
            return Ok(Change::Processed {
                id,
                offset,
                processed_at_ms,
            });
        }
        if key == PROGRESS_KEY {
            return match value {
                Some([PROGRESS_VERSION, rest @ ..]) if rest.len() == 8 => Ok(Change::Progress {
                    input_offset: i64::from_be_bytes(fixed(rest)),
                }),
                Some([PROGRESS_VERSION, rest @ ..]) => Err(corrupt(format!(
                    "progress value is {} bytes long, expected 9",
                    rest.len() + 1
                ))),
                Some([other, ..]) => Err(corrupt(format!(
                    "progress value has version {other}, this build reads {PROGRESS_VERSION}; \
                     was the changelog written by a newer onceflow?"
                ))),
                Some([]) | None => Err(corrupt("progress record without a value".into())),
            };
        }
        if let Some(user_key) = key.strip_prefix(STATE_PREFIX) {
            return Ok(Change::State {
                key: user_key.to_vec(),
                value: value.map(<[u8]>::to_vec),
            });
        }
        Err(corrupt(format!(
            "key {} has none of the `e:` (processed event), `s:` (state) and `p:` (progress) prefixes",
            preview(key)
        )))
    }
}

/// `prefix` followed by `rest`.
fn prefixed(prefix: &[u8], rest: &[u8]) -> Vec<u8> {
    let mut key = Vec::with_capacity(prefix.len() + rest.len());
    key.extend_from_slice(prefix);
    key.extend_from_slice(rest);
    key
}

/// The offset and processing time of a `Processed` value.
fn decode_processed(value: &[u8]) -> std::result::Result<(i64, i64), String> {
    match value.first() {
        None => return Err("processed-event value is empty".to_string()),
        Some(&PROCESSED_VERSION) => {}
        Some(other) => {
            return Err(format!(
                "processed-event value has version {other}, this build reads {PROCESSED_VERSION}; \
                 was the changelog written by a newer onceflow?"
            ));
        }
    }
    if value.len() != PROCESSED_LEN {
        return Err(format!(
            "processed-event value is {} bytes long, expected {PROCESSED_LEN}",
            value.len()
        ));
    }
    let offset = i64::from_be_bytes(fixed(&value[1..9]));
    let processed_at_ms = i64::from_be_bytes(fixed(&value[9..17]));
    Ok((offset, processed_at_ms))
}

/// The 8 bytes of a slice whose length the caller checked.
fn fixed(bytes: &[u8]) -> [u8; 8] {
    let mut out = [0; 8];
    out.copy_from_slice(bytes);
    out
}

/// A short, printable rendering of a key for error messages; keys may be binary and large.
fn preview(key: &[u8]) -> String {
    const MAX: usize = 32;
    let shown = &key[..key.len().min(MAX)];
    let mut text = format!("{:?}", String::from_utf8_lossy(shown));
    if key.len() > MAX {
        text.push_str(&format!("… ({} bytes)", key.len()));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    const WHAT: &str = "changelog record orders-txlog/2@118";

    fn round_trip(change: Change) {
        let (key, value) = change.encode();
        assert_eq!(
            change.encoded_len(),
            key.len() + value.as_ref().map_or(0, Vec::len),
            "{change:?}"
        );
        let decoded = Change::decode(&key, value.as_deref(), WHAT).expect("decodes");
        assert_eq!(decoded, change);
    }

    fn corrupt_message(key: &[u8], value: Option<&[u8]>) -> String {
        match Change::decode(key, value, WHAT) {
            Err(Error::Corrupt { what, message, .. }) => {
                assert_eq!(what, WHAT);
                message
            }
            other => panic!("expected Error::Corrupt, got {other:?}"),
        }
    }

    #[test]
    fn every_variant_round_trips() {
        round_trip(Change::Processed {
            id: "order-17".into(),
            offset: 118,
            processed_at_ms: 1_700_000_000_123,
        });
        round_trip(Change::Processed {
            id: String::new(),
            offset: i64::MIN,
            processed_at_ms: -1,
        });
        round_trip(Change::Expired { id: "é:ü".into() });
        round_trip(Change::State {
            key: vec![0, 255, b':'],
            value: Some(vec![1, 2, 3]),
        });
        round_trip(Change::State {
            key: b"counter".to_vec(),
            value: Some(Vec::new()),
        });
        round_trip(Change::State {
            key: Vec::new(),
            value: None,
        });
        round_trip(Change::Progress { input_offset: 0 });
        round_trip(Change::Progress {
            input_offset: 1 << 40,
        });
    }

    #[test]
    fn encoding_is_the_documented_layout() {
        let (key, value) = Change::Processed {
            id: "a".into(),
            offset: 0x0102,
            processed_at_ms: -2,
        }
        .encode();
        assert_eq!(key, b"e:a");
        let mut expected = vec![1, 0, 0, 0, 0, 0, 0, 1, 2];
        expected.extend_from_slice(&(-2i64).to_be_bytes());
        assert_eq!(value, Some(expected));
        assert_eq!(
            Change::Expired { id: "a".into() }.encode(),
            (b"e:a".to_vec(), None)
        );
        assert_eq!(
            Change::State {
                key: b"k".to_vec(),
                value: Some(b"v".to_vec())
            }
            .encode(),
            (b"s:k".to_vec(), Some(b"v".to_vec()))
        );
    }

    #[test]
    fn a_key_is_shared_by_a_change_and_the_change_that_undoes_it() {
        // Compaction keeps the last record per key: an expiry must overwrite the processing.
        let processed = Change::Processed {
            id: "x".into(),
            offset: 1,
            processed_at_ms: 2,
        };
        assert_eq!(
            processed.encode().0,
            Change::Expired { id: "x".into() }.encode().0
        );
        let set = Change::State {
            key: b"x".to_vec(),
            value: Some(b"1".to_vec()),
        };
        let deleted = Change::State {
            key: b"x".to_vec(),
            value: None,
        };
        assert_eq!(set.encode().0, deleted.encode().0);
        assert_ne!(processed.encode().0, set.encode().0);
    }

    #[test]
    fn corrupt_records_are_reported_not_guessed() {
        let valid = Change::Processed {
            id: "a".into(),
            offset: 5,
            processed_at_ms: 6,
        }
        .encode()
        .1
        .expect("value");

        assert!(corrupt_message(b"x:a", Some(b"v")).contains("prefix"));
        assert!(corrupt_message(b"", None).contains("prefix"));
        assert!(corrupt_message(b"e", None).contains("prefix"));
        assert!(corrupt_message(b"e:\xff\xfe", None).contains("UTF-8"));
        assert!(corrupt_message(b"e:a", Some(&[])).contains("empty"));
        assert!(corrupt_message(b"e:a", Some(&valid[..16])).contains("16 bytes"));
        let mut longer = valid.clone();
        longer.push(0);
        assert!(corrupt_message(b"e:a", Some(&longer)).contains("18 bytes"));
        let mut newer = valid.clone();
        newer[0] = 2;
        assert!(corrupt_message(b"e:a", Some(&newer)).contains("version 2"));
        assert!(corrupt_message(b"p:", None).contains("without a value"));
        assert!(corrupt_message(b"p:", Some(&[1, 2])).contains("2 bytes"));
        assert!(corrupt_message(b"p:", Some(&[9; 9])).contains("version 9"));
    }

    #[test]
    fn long_binary_keys_are_shortened_in_errors() {
        let key = vec![b'z'; 1000];
        let message = corrupt_message(&key, None);
        assert!(message.contains("1000 bytes"), "{message}");
        assert!(message.len() < 200, "{message}");
    }
}
