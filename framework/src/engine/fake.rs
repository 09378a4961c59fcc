//! An in-process Kafka for the engine's unit tests: it implements [`Source`] and
//! [`Sink`], records every call in order, keeps what a transaction wrote apart until it
//! commits (an abort drops it), and fails the call a test names with the error it gives.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Mutex;

use crate::engine::seams::{Landing, Outgoing, Sink, Source};
use crate::{Error, Result};

/// One call the engine made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Call {
    Begin,
    Send {
        topic: String,
        partition: Option<i32>,
    },
    SendOffsets(Vec<(i32, i64)>),
    Commit,
    Abort,
    Flush,
    ConsumerCommit(Vec<(i32, i64)>),
}

/// The kinds of call a fault can be put on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Kind {
    Begin,
    /// Sending a record (to any topic, or the one the fault names).
    Send,
    /// The acknowledgement of a sent record.
    Landing,
    SendOffsets,
    Commit,
    Abort,
    Flush,
    ConsumerCommit,
}

/// A record as the fake stores it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Stored {
    pub(crate) topic: String,
    pub(crate) partition: i32,
    pub(crate) offset: i64,
    pub(crate) key: Option<Vec<u8>>,
    pub(crate) value: Option<Vec<u8>>,
    pub(crate) headers: Vec<(String, Option<Vec<u8>>)>,
}

impl Stored {
    /// The value of header `name`, as text.
    pub(crate) fn header(&self, name: &str) -> Option<String> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .and_then(|(_, v)| v.as_deref())
            .map(|v| String::from_utf8_lossy(v).into_owned())
    }
}

type MakeError = Box<dyn Fn() -> Error + Send>;

struct Fault {
    kind: Kind,
    /// Only calls about this topic count (sends and landings), when set.
    topic: Option<String>,
    /// Fail the nth matching call (1 for the first).
    nth: u32,
    error: MakeError,
    seen: u32,
}

#[derive(Default)]
struct Inner {
    calls: Vec<Call>,
    faults: Vec<Fault>,
    next_offset: BTreeMap<(String, i32), i64>,
    in_transaction: bool,
    open: Vec<Stored>,
    open_offsets: Vec<(i32, i64)>,
    committed: Vec<Stored>,
    committed_offsets: BTreeMap<i32, i64>,
}

impl Inner {
    fn fault(&mut self, kind: Kind, topic: Option<&str>) -> Result<()> {
        for fault in &mut self.faults {
            if fault.kind != kind || (fault.topic.is_some() && fault.topic.as_deref() != topic) {
                continue;
            }
            fault.seen += 1;
            if fault.seen == fault.nth {
                return Err((fault.error)());
            }
        }
        Ok(())
    }

    /// One offset in each partition the open transaction wrote, for its marker.
    fn mark(&mut self) {
        let touched: Vec<(String, i32)> = self
            .open
            .iter()
            .map(|r| (r.topic.clone(), r.partition))
            .collect();
        for key in touched {
            *self.next_offset.entry(key).or_default() += 1;
        }
    }
}

/// The fake cluster: one instance is both the source and the sink of a batch.
#[derive(Default)]
pub(crate) struct FakeKafka(Mutex<Inner>);

impl std::fmt::Debug for FakeKafka {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeKafka").finish_non_exhaustive()
    }
}

/// A sent record's acknowledgement, decided when it was sent.
#[derive(Debug)]
pub(crate) struct FakePending(std::result::Result<(i32, i64), String>);

impl Landing for FakePending {
    fn landed(self) -> impl Future<Output = Result<(i32, i64)>> + Send {
        std::future::ready(self.0.map_err(|message| Error::Kafka {
            operation: crate::Operation::produce("fake"),
            code: rdkafka::types::RDKafkaErrorCode::MessageSizeTooLarge.into(),
            message,
            class: crate::ErrorClass::Rejected,
        }))
    }
}

impl FakeKafka {
    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Fails the `nth` call of `kind` (about `topic`, when given) with `error()`.
    pub(crate) fn fail(
        &self,
        kind: Kind,
        topic: Option<&str>,
        nth: u32,
        error: impl Fn() -> Error + Send + 'static,
    ) {
        self.inner().faults.push(Fault {
            kind,
            topic: topic.map(str::to_owned),
            nth,
            error: Box::new(error),
            seen: 0,
        });
    }

    /// Every call so far, in order.
    pub(crate) fn calls(&self) -> Vec<Call> {
        self.inner().calls.clone()
    }

    /// What a `read_committed` reader of `topic` sees.
    pub(crate) fn committed(&self, topic: &str) -> Vec<Stored> {
        self.inner()
            .committed
            .iter()
            .filter(|r| r.topic == topic)
            .cloned()
            .collect()
    }

    /// The input offsets committed so far.
    pub(crate) fn committed_offsets(&self) -> BTreeMap<i32, i64> {
        self.inner().committed_offsets.clone()
    }
}

impl Source for FakeKafka {
    fn commit(&self, offsets: Vec<(i32, i64)>) -> impl Future<Output = Result<()>> + Send {
        let mut inner = self.inner();
        inner.calls.push(Call::ConsumerCommit(offsets.clone()));
        let result = inner.fault(Kind::ConsumerCommit, None).map(|()| {
            inner.committed_offsets.extend(offsets);
        });
        std::future::ready(result)
    }
}

impl Sink<FakeKafka> for FakeKafka {
    type Pending = FakePending;

    fn begin(&self) -> Result<()> {
        let mut inner = self.inner();
        inner.calls.push(Call::Begin);
        inner.fault(Kind::Begin, None)?;
        assert!(!inner.in_transaction, "begin inside an open transaction");
        inner.in_transaction = true;
        Ok(())
    }

    fn send(&self, record: Outgoing<'_>) -> impl Future<Output = Result<FakePending>> + Send {
        let mut inner = self.inner();
        inner.calls.push(Call::Send {
            topic: record.topic.to_owned(),
            partition: record.partition,
        });
        let result = inner.fault(Kind::Send, Some(record.topic)).map(|()| {
            let partition = record.partition.unwrap_or(0);
            let next = inner
                .next_offset
                .entry((record.topic.to_owned(), partition))
                .or_default();
            let offset = *next;
            *next += 1;
            let landing = match inner.fault(Kind::Landing, Some(record.topic)) {
                Ok(()) => Ok((partition, offset)),
                Err(error) => Err(error.to_string()),
            };
            let stored = Stored {
                topic: record.topic.to_owned(),
                partition,
                offset,
                key: record.key.map(<[u8]>::to_vec),
                value: record.value.map(<[u8]>::to_vec),
                headers: record
                    .headers
                    .iter()
                    .map(|(n, v)| ((*n).to_owned(), v.map(<[u8]>::to_vec)))
                    .collect(),
            };
            if landing.is_ok() {
                if inner.in_transaction {
                    inner.open.push(stored);
                } else {
                    inner.committed.push(stored);
                }
            }
            FakePending(landing)
        });
        std::future::ready(result)
    }

    fn send_offsets(
        &self,
        _source: &FakeKafka,
        _topic: &str,
        offsets: Vec<(i32, i64)>,
    ) -> impl Future<Output = Result<()>> + Send {
        let mut inner = self.inner();
        inner.calls.push(Call::SendOffsets(offsets.clone()));
        let result = inner.fault(Kind::SendOffsets, None).map(|()| {
            inner.open_offsets.extend(offsets);
        });
        std::future::ready(result)
    }

    fn commit(&self) -> impl Future<Output = Result<()>> + Send {
        let mut inner = self.inner();
        inner.calls.push(Call::Commit);
        let result = inner.fault(Kind::Commit, None).map(|()| {
            inner.mark();
            let open = std::mem::take(&mut inner.open);
            inner.committed.extend(open);
            let offsets = std::mem::take(&mut inner.open_offsets);
            inner.committed_offsets.extend(offsets);
            inner.in_transaction = false;
        });
        std::future::ready(result)
    }

    fn abort(&self) -> impl Future<Output = Result<()>> + Send {
        let mut inner = self.inner();
        inner.calls.push(Call::Abort);
        let result = inner.fault(Kind::Abort, None).map(|()| {
            inner.mark();
            inner.open.clear();
            inner.open_offsets.clear();
            inner.in_transaction = false;
        });
        std::future::ready(result)
    }

    fn flush(&self) -> impl Future<Output = Result<()>> + Send {
        let mut inner = self.inner();
        inner.calls.push(Call::Flush);
        std::future::ready(inner.fault(Kind::Flush, None))
    }
}
