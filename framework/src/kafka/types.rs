//! Plain record types that cross the `kafka` boundary (public through `testing`).
#![cfg_attr(not(feature = "testing"), allow(unreachable_pub))]

use rdkafka::message::{Headers, Message};

/// A record read from a topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Topic it was read from.
    pub topic: String,
    /// Partition it was read from.
    pub partition: i32,
    /// Its offset in that partition.
    pub offset: i64,
    /// Key bytes, if any.
    pub key: Option<Vec<u8>>,
    /// Value bytes, if any (a tombstone has none).
    pub value: Option<Vec<u8>>,
    /// Headers in order; a header may have no value.
    pub headers: Vec<(String, Option<Vec<u8>>)>,
    /// Timestamp in milliseconds since the epoch, if the record has one.
    pub timestamp_ms: Option<i64>,
}

impl Record {
    /// The key as UTF-8 text (lossy), or `""` when there is none.
    pub fn key_str(&self) -> String {
        String::from_utf8_lossy(self.key.as_deref().unwrap_or_default()).into_owned()
    }

    /// The value as UTF-8 text (lossy), or `""` when there is none.
    #[cfg(feature = "testing")]
    pub fn value_str(&self) -> String {
        String::from_utf8_lossy(self.value.as_deref().unwrap_or_default()).into_owned()
    }

    /// The value of the first header named `name`.
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(key, _)| key == name)
            .and_then(|(_, value)| value.as_deref())
    }
}

/// A record to write.
#[cfg(feature = "testing")]
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OutgoingRecord {
    /// Key bytes; records with the same key land on the same partition.
    pub key: Option<Vec<u8>>,
    /// Value bytes.
    pub value: Option<Vec<u8>>,
    /// Headers.
    pub headers: Vec<(String, Vec<u8>)>,
    /// A partition to write to, instead of the one the key hashes to.
    pub partition: Option<i32>,
    /// The record's timestamp (ms since the epoch); `None`: the producer's clock.
    pub timestamp_ms: Option<i64>,
}

#[cfg(feature = "testing")]
impl OutgoingRecord {
    /// A record with a key and a value.
    pub fn keyed(key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) -> Self {
        OutgoingRecord {
            key: Some(key.into()),
            value: Some(value.into()),
            ..Default::default()
        }
    }

    /// Adds a header.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<Vec<u8>>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// Writes to `partition` instead of the key's partition.
    pub fn to_partition(mut self, partition: i32) -> Self {
        self.partition = Some(partition);
        self
    }

    /// Gives the record its own timestamp (ms since the epoch).
    pub fn at_ms(mut self, timestamp_ms: i64) -> Self {
        self.timestamp_ms = Some(timestamp_ms);
        self
    }
}

/// Copies a consumed message into a [`Record`].
pub(super) fn to_record(message: &impl Message) -> Record {
    let headers = message
        .headers()
        .map(|headers| {
            headers
                .iter()
                .map(|header| (header.key.to_owned(), header.value.map(<[u8]>::to_vec)))
                .collect()
        })
        .unwrap_or_default();
    Record {
        topic: message.topic().to_owned(),
        partition: message.partition(),
        offset: message.offset(),
        key: message.key().map(<[u8]>::to_vec),
        value: message.payload().map(<[u8]>::to_vec),
        headers,
        timestamp_ms: message.timestamp().to_millis(),
    }
}
