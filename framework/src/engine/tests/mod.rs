//! The engine's unit tests, one file per subject: a batch, its commit, dead letters,
//! outputs, recovery, fences, rebalances, replay. Each test drives the engine's own code
//! through the in-memory Kafka of `testing/kafka.rs` (and a real transaction log in a
//! temporary directory where a batch needs one), so each runs in milliseconds; what needs
//! a broker is in the workspace's `tests/`.
//!
//! The helpers more than one subject uses are here, in two rigs: `batch_rig` runs a batch
//! (`Rig`, its processor, record builders, `shape`), `recovery_rig` recovers an instance
//! owning partitions 0 and 1.

mod batch;
mod commit;
mod dead_letters;
mod fences;
mod outputs;
mod rebalance;
mod recovery;
mod replay;

/// A batch's rig: the fake Kafka and a real transaction log, the records it reads and
/// the processor that sums them.
mod batch_rig {
    use std::collections::{BTreeMap, BTreeSet, HashMap};
    use std::sync::Arc;
    use std::time::Duration;

    use crate::config::{DeliveryMode, EngineConfig};
    use crate::engine::batch::Batch;
    use crate::engine::stats::Stats;
    use crate::kafka::Record;
    use crate::testing::kafka::{Call, FakeKafka};
    use crate::txlog::TxLog;
    use crate::{Context, Error, Event, Processor, Result};

    pub(super) const OUT: &str = "out";
    pub(super) const CHANGELOG: &str = "g-txlog";
    pub(super) const DLQ: &str = "g-dlq";

    #[derive(Debug, serde::Deserialize, serde::Serialize, Default)]
    pub(super) struct In {
        pub(super) id: Option<String>,
        pub(super) key: String,
        pub(super) amount: i64,
        /// Fails transiently this many times first.
        #[serde(default)]
        pub(super) transient: u32,
        /// Stores a state value this large.
        #[serde(default)]
        pub(super) big_state: usize,
        /// Takes this long.
        #[serde(default)]
        pub(super) slow_ms: u64,
    }

    impl Event for In {
        fn event_id(&self) -> Option<String> {
            self.id.clone()
        }

        fn key(&self) -> Option<String> {
            Some(self.key.clone()).filter(|key| !key.is_empty())
        }
    }

    /// Emits each key's running sum.
    #[derive(Default)]
    struct Summer {
        attempts: HashMap<i64, u32>,
    }

    #[async_trait::async_trait]
    impl Processor for Summer {
        type Input = In;

        fn name(&self) -> &str {
            "summer"
        }

        async fn process(&mut self, input: In, ctx: &mut Context<'_>) -> Result<()> {
            let attempt = self.attempts.entry(ctx.offset()).or_default();
            *attempt += 1;
            if *attempt <= input.transient {
                return Err(Error::transient("not yet"));
            }
            if input.slow_ms > 0 {
                tokio::time::sleep(Duration::from_millis(input.slow_ms)).await;
            }
            if input.big_state > 0 {
                ctx.state().put("blob", &"x".repeat(input.big_state))?;
            }
            let sum = ctx.state().get::<i64>(&input.key)?.unwrap_or(0) + input.amount;
            ctx.state().put(&input.key, &sum)?;
            ctx.emit(OUT, &input.key, &sum)
        }
    }

    /// One batch's surroundings: the fake, a real transaction log in a temporary directory.
    pub(super) struct Rig {
        pub(super) kafka: FakeKafka,
        pub(super) txlog: Arc<TxLog>,
        pub(super) stats: Arc<Stats>,
        pub(super) config: EngineConfig,
        pub(super) declared: BTreeSet<String>,
        pub(super) limits: BTreeMap<String, usize>,
        pub(super) _dir: tempfile::TempDir,
    }

    impl Rig {
        pub(super) fn new(delivery: DeliveryMode) -> Rig {
            let dir = tempfile::tempdir().expect("temp dir");
            let (txlog, _) = TxLog::open(&dir.path().join("log")).expect("log");
            let mut config = EngineConfig::new("fake:9092", "g", "a", "in", dir.path())
                .output(OUT)
                .delivery(delivery);
            config.max_retry_time = Duration::from_secs(2);
            Rig {
                kafka: FakeKafka::default(),
                txlog: Arc::new(txlog),
                stats: Arc::default(),
                config,
                declared: [OUT.to_owned()].into(),
                limits: [
                    (OUT.to_owned(), 1_000_000),
                    (CHANGELOG.to_owned(), 1_000_000),
                    (DLQ.to_owned(), 1_000_000),
                ]
                .into(),
                _dir: dir,
            }
        }

        pub(super) fn batch(&self) -> Batch<'_, FakeKafka, FakeKafka> {
            Batch {
                config: &self.config,
                consumer: &self.kafka,
                producer: &self.kafka,
                txlog: &self.txlog,
                stats: &self.stats,
                declared: &self.declared,
                changelog: CHANGELOG,
                output_limits: &self.limits,
            }
        }

        pub(super) async fn run(&self, records: Vec<Record>) -> Result<()> {
            self.batch().run(&mut Summer::default(), records).await
        }

        /// The sums a `read_committed` reader of the output sees.
        pub(super) fn sums(&self) -> Vec<i64> {
            self.kafka
                .committed(OUT)
                .iter()
                .map(|r| {
                    serde_json::from_slice(r.value.as_deref().unwrap_or_default()).expect("sum")
                })
                .collect()
        }

        pub(super) fn state(&self, key: &str) -> Option<i64> {
            self.txlog
                .state(0, key.as_bytes())
                .expect("state")
                .map(|v| serde_json::from_slice(&v).expect("json"))
        }
    }

    pub(super) fn record(offset: i64, input: In) -> Record {
        Record {
            topic: "in".into(),
            partition: 0,
            offset,
            key: Some(input.key.clone().into_bytes()),
            value: Some(serde_json::to_vec(&input).expect("json")),
            headers: Vec::new(),
            timestamp_ms: None,
        }
    }

    pub(super) fn amount(offset: i64, id: &str, amount: i64) -> Record {
        record(
            offset,
            In {
                id: Some(id.into()),
                key: "k".into(),
                amount,
                ..In::default()
            },
        )
    }

    /// The calls, with sends to a topic shown by its name.
    pub(super) fn shape(calls: &[Call]) -> Vec<String> {
        calls
            .iter()
            .map(|c| match c {
                Call::Send { topic, .. } => format!("send {topic}"),
                Call::SendOffsets(o) => format!("offsets {o:?}"),
                Call::ConsumerCommit(o) => format!("consumer commit {o:?}"),
                other => format!("{other:?}").to_lowercase(),
            })
            .collect()
    }
}

/// Recovery's rig: an instance owning two partitions, and what recovery should have done.
mod recovery_rig {
    use std::collections::BTreeSet;
    use std::sync::Arc;

    use crate::Error;
    use crate::config::{DeliveryMode, EngineConfig};
    use crate::engine::recovery::{Resync, recover};
    use crate::engine::seams::Source;
    use crate::engine::stats::Stats;
    use crate::testing::kafka::{Call, FakeKafka};

    pub(super) struct Rig {
        pub(super) kafka: FakeKafka,
        pub(super) config: EngineConfig,
        pub(super) stats: Arc<Stats>,
    }

    impl Rig {
        /// An instance owning partitions 0 and 1, whose group committed offset 10 on 0.
        pub(super) async fn new(delivery: DeliveryMode) -> Rig {
            let kafka = FakeKafka::default();
            kafka.commit(vec![(0, 10)]).await.expect("commit");
            kafka.assign(&[0, 1]);
            kafka.clear_calls();
            Rig {
                kafka,
                config: EngineConfig::new("fake:9092", "g", "a", "in", "/tmp/unused")
                    .delivery(delivery),
                stats: Arc::default(),
            }
        }

        pub(super) async fn recover(
            &self,
            cause: &Error,
        ) -> crate::Result<Resync<'_, FakeKafka, FakeKafka>> {
            let resync = self.kafka.resync(&self.config, &self.stats);
            let mut producer = self.kafka.clone();
            let owned: BTreeSet<i32> = [0, 1].into();
            recover(&resync, &self.kafka, &mut producer, &owned, cause).await?;
            Ok(resync)
        }
    }

    pub(super) fn fenced() -> Error {
        Error::Fenced {
            what: "group.instance.id `a`".into(),
            detail: "a successor joined".into(),
        }
    }

    /// Recovery made the calls `first`, then caught up with the group (held) and rewound.
    pub(super) fn assert_caught_up_after(rig: &Rig, first: &[Call]) {
        let mut want = first.to_vec();
        want.extend([
            Call::Committed(vec![0, 1]),
            Call::Restore(0, Some(10)),
            Call::Restore(1, None),
            Call::Release,
            Call::Seek(vec![(0, Some(10)), (1, None)]),
        ]);
        assert_eq!(rig.kafka.calls(), want);
    }
}
