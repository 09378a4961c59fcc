//! The workload of the engine tests: keyed amounts in, one output per input with the
//! key's running sum, and the checks that say whether that happened exactly once.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use onceflow::{Context, Event, Processor, Result};
use onceflow_testkit::{Isolation, Kafka, OutgoingRecord};
use serde::{Deserialize, Serialize};

/// An input event.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
pub struct Amount {
    /// Business event ID; absent for events deduplicated by offset only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// The key whose sum this adds to.
    pub key: String,
    /// The amount added.
    pub amount: i64,
    /// The ID rides in the payload only: the engine is told the event has none, so
    /// nothing but offsets keeps it from being processed twice (the ID still names its
    /// output in the checks, which then catch a doubled one).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub anonymous: bool,
}

impl Event for Amount {
    fn event_id(&self) -> Option<String> {
        self.id.clone().filter(|_| !self.anonymous)
    }
}

/// An output record.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
pub struct Summed {
    /// The input's ID.
    pub id: Option<String>,
    /// The input's key.
    pub key: String,
    /// The input's amount.
    pub amount: i64,
    /// The key's sum including this input.
    pub sum: i64,
}

/// Emits one [`Summed`] per [`Amount`], keeping each key's sum in state; an amount of 0
/// resets the key (its state is deleted, its output's sum is 0). A negative amount is
/// refused (a processing error: the record is dead-lettered, the sum
/// untouched), so the fault tests can check their dead letters too.
#[derive(Debug, Clone)]
pub struct Sum {
    output: String,
    charging: bool,
}

impl Sum {
    /// A processor writing to `output`.
    pub fn new(output: impl Into<String>) -> Self {
        Sum {
            output: output.into(),
            charging: false,
        }
    }

    /// The same, also recording a `charge` effect of each amount for its key (needs
    /// effects on in the configuration).
    pub fn charging(output: impl Into<String>) -> Self {
        Sum {
            charging: true,
            ..Sum::new(output)
        }
    }
}

#[onceflow::async_trait]
impl Processor for Sum {
    type Input = Amount;

    fn name(&self) -> &str {
        "sum"
    }

    async fn process(&mut self, input: Amount, ctx: &mut Context<'_>) -> Result<()> {
        if input.amount < 0 {
            return Err(onceflow::Error::processing(format!(
                "negative amount {} refused",
                input.amount
            )));
        }
        // An amount of 0 resets the key: its state is deleted (a tombstone in the
        // changelog, which compaction removes in time).
        let sum = if input.amount == 0 {
            ctx.state().delete(&input.key);
            0
        } else {
            let sum = ctx.state().get::<i64>(&input.key)?.unwrap_or(0) + input.amount;
            ctx.state().put(&input.key, &sum)?;
            sum
        };
        let output = Summed {
            id: input.id.clone(),
            key: input.key.clone(),
            amount: input.amount,
            sum,
        };
        ctx.emit(&self.output, &input.key, &output)?;
        if self.charging {
            ctx.effect(
                "charge",
                &input.key,
                &serde_json::json!({"id": input.id, "amount": input.amount}),
            )?;
        }
        Ok(())
    }
}

/// `count` events numbered from `first`, spread over `keys` keys, each with an ID.
pub fn amounts(first: usize, count: usize, keys: usize) -> Vec<Amount> {
    (first..first + count)
        .map(|i| Amount {
            id: Some(format!("e-{i}")),
            key: format!("k{}", i % keys),
            amount: (i % 7 + 1) as i64,
            anonymous: false,
        })
        .collect()
}

/// Writes events keyed by their key, so each key's events stay in order on one partition.
pub async fn produce(
    kafka: &Kafka,
    topic: &str,
    events: &[Amount],
) -> onceflow_testkit::Result<()> {
    let records = events.iter().map(|event| {
        OutgoingRecord::keyed(event.key.clone(), serde_json::to_vec(event).expect("json"))
    });
    kafka.produce(topic, records).await.map(|_| ())
}

/// The outputs visible to `read_committed`, in partition and offset order.
pub async fn committed_outputs(
    kafka: &Kafka,
    topic: &str,
) -> onceflow_testkit::Result<Vec<Summed>> {
    let records = kafka.read_to_end(topic, Isolation::ReadCommitted).await?;
    Ok(records
        .iter()
        .map(|r| {
            serde_json::from_slice(r.value.as_deref().unwrap_or_default()).expect("output json")
        })
        .collect())
}

/// Waits until at least `count` outputs are visible; fails with what was seen.
pub async fn wait_for_outputs(
    kafka: &Kafka,
    topic: &str,
    count: usize,
    within: Duration,
) -> onceflow_testkit::Result<Vec<Summed>> {
    let deadline = Instant::now() + within;
    loop {
        let outputs = committed_outputs(kafka, topic).await?;
        if outputs.len() >= count || Instant::now() >= deadline {
            assert!(
                outputs.len() >= count,
                "only {} of {count} outputs visible after {within:?}",
                outputs.len()
            );
            return Ok(outputs);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Waits until at least `count` outputs are visible, or the instance behind `running`
/// stopped, or `deadline` passed, without failing: the caller's checks then say what is
/// missing and why. Reads that fail (a broker fault under way) are tried again.
pub async fn outputs_reach<T>(
    kafka: &Kafka,
    topic: &str,
    count: usize,
    deadline: Instant,
    running: &tokio::task::JoinHandle<T>,
) {
    while Instant::now() < deadline && !running.is_finished() {
        match committed_outputs(kafka, topic).await {
            Ok(outputs) if outputs.len() >= count => return,
            _ => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    }
}

/// Checks exactly-once: every distinct input (by ID) has exactly one output, nothing
/// else was output, each key's outputs come in input order with the exact running sum.
/// `inputs` is every distinct event, in the order it was first produced.
pub fn assert_exactly_once(inputs: &[Amount], outputs: &[Summed]) {
    let expected_ids: BTreeSet<&str> = inputs.iter().filter_map(|a| a.id.as_deref()).collect();
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    for output in outputs {
        *seen
            .entry(output.id.as_deref().expect("output without id"))
            .or_default() += 1;
    }
    let doubled: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).take(10).collect();
    assert!(doubled.is_empty(), "outputs more than once: {doubled:?}");
    let missing: Vec<_> = expected_ids
        .iter()
        .filter(|id| !seen.contains_key(*id))
        .take(10)
        .collect();
    assert!(
        missing.is_empty(),
        "inputs without output: {missing:?} ({} outputs)",
        outputs.len()
    );
    assert_eq!(
        outputs.len(),
        expected_ids.len(),
        "outputs for events never sent"
    );

    // Per key, in input order: the running sums.
    let mut expected: BTreeMap<&str, Vec<(&str, i64)>> = BTreeMap::new();
    let mut sums: BTreeMap<&str, i64> = BTreeMap::new();
    for input in inputs {
        let sum = sums.entry(&input.key).or_default();
        *sum += input.amount;
        expected
            .entry(&input.key)
            .or_default()
            .push((input.id.as_deref().expect("id"), *sum));
    }
    let mut actual: BTreeMap<&str, Vec<(&str, i64)>> = BTreeMap::new();
    for output in outputs {
        actual
            .entry(&output.key)
            .or_default()
            .push((output.id.as_deref().expect("id"), output.sum));
    }
    for (key, want) in &expected {
        let got = actual.get(key).cloned().unwrap_or_default();
        if &got != want {
            let first = got
                .iter()
                .zip(want)
                .position(|(g, w)| g != w)
                .unwrap_or(got.len().min(want.len()));
            panic!(
                "key {key}: outputs out of order or sums wrong at position {first}: got {:?}, want {:?}",
                got.get(first),
                want.get(first)
            );
        }
    }
}

/// Each key's final sum.
pub fn final_sums(inputs: &[Amount]) -> BTreeMap<String, i64> {
    let mut sums = BTreeMap::new();
    for input in inputs {
        *sums.entry(input.key.clone()).or_default() += input.amount;
    }
    sums
}

/// Waits until `group` has committed offsets at the end of every partition of `input`
/// (the input is not transactional, so its end is its last offset plus one).
pub async fn wait_for_caught_up(
    kafka: &Kafka,
    group: &str,
    input: &str,
    within: Duration,
) -> onceflow_testkit::Result<()> {
    let records = kafka.read_to_end(input, Isolation::ReadUncommitted).await?;
    let mut ends: BTreeMap<i32, Option<i64>> = BTreeMap::new();
    for record in &records {
        ends.insert(record.partition, Some(record.offset + 1));
    }
    let deadline = Instant::now() + within;
    loop {
        // A group coordinator that is still loading (a fresh broker's first groups)
        // answers NotCoordinator for a moment: that is "not yet", not a failure.
        let committed = match kafka.committed_offsets(group, input).await {
            Ok(committed) => committed,
            Err(error) if error.is_retriable() && Instant::now() < deadline => {
                tracing::debug!(%error, "reading committed offsets; trying again");
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
            Err(error) => return Err(error),
        };
        if ends
            .iter()
            .all(|(partition, end)| committed.get(partition) == Some(end))
        {
            return Ok(());
        }
        assert!(
            Instant::now() < deadline,
            "committed offsets {committed:?}, input ends {ends:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Why outputs are missing, for a test that waited in vain: which events have no
/// committed output, whether their outputs were written but are not (or not yet)
/// committed (an open transaction holding the last stable offset back), and the group's
/// committed offsets against the input's ends (offsets past an event without its output
/// would be a loss; offsets short of it, an instance that stopped making progress).
pub async fn explain_missing(
    kafka: &Kafka,
    group: &str,
    input: &str,
    output: &str,
    events: &[Amount],
) -> String {
    let committed: BTreeSet<String> = match committed_outputs(kafka, output).await {
        Ok(outputs) => outputs.into_iter().filter_map(|o| o.id).collect(),
        Err(error) => return format!("(could not read the outputs: {error})"),
    };
    let missing: Vec<&str> = events
        .iter()
        .filter(|e| e.amount >= 0)
        .filter_map(|e| e.id.as_deref())
        .filter(|id| !committed.contains(*id))
        .collect();
    let written: BTreeMap<String, (i32, i64)> = kafka
        .read_to_end(output, Isolation::ReadUncommitted)
        .await
        .map(|records| {
            records
                .iter()
                .filter_map(|r| {
                    let summed: Summed = serde_json::from_slice(r.value.as_deref()?).ok()?;
                    Some((summed.id?, (r.partition, r.offset)))
                })
                .collect()
        })
        .unwrap_or_default();
    let uncommitted: Vec<(&str, (i32, i64))> = missing
        .iter()
        .filter_map(|id| written.get(*id).map(|at| (*id, *at)))
        .take(10)
        .collect();
    let written_in = kafka
        .read_to_end(input, Isolation::ReadUncommitted)
        .await
        .unwrap_or_default();
    let ends: BTreeMap<i32, i64> = written_in
        .iter()
        .map(|r| (r.partition, r.offset + 1))
        .collect();
    // Where each missing event sits in the input (every copy), to match with the log.
    let wanted: BTreeSet<&str> = missing.iter().copied().collect();
    let mut input_at: BTreeMap<&str, Vec<(i32, i64)>> = BTreeMap::new();
    for record in &written_in {
        let Some(event) = record
            .value
            .as_deref()
            .and_then(|v| serde_json::from_slice::<Amount>(v).ok())
        else {
            continue;
        };
        if let Some(id) = event.id.as_deref().and_then(|id| wanted.get(id)) {
            input_at
                .entry(*id)
                .or_default()
                .push((record.partition, record.offset));
        }
    }
    let input_at: Vec<(&str, Vec<(i32, i64)>)> = missing
        .iter()
        .take(10)
        .map(|id| (*id, input_at.get(id).cloned().unwrap_or_default()))
        .collect();
    let offsets = kafka.committed_offsets(group, input).await;
    // A last stable offset held below the high watermark hides every output after it
    // from a `read_committed` reader, this test's included.
    let output_ends = match kafka.stable_ends(output).await {
        Ok(ends) => format!("{ends:?}"),
        Err(error) => format!("(could not read them: {error})"),
    };
    format!(
        "{} events without a committed output (first: {:?}); in the input at (partition, \
         offset): {input_at:?}; of those written but not committed (last written at \
         (partition, offset)): {uncommitted:?}; the group's committed offsets {offsets:?}, \
         the input's ends {ends:?}; the output's (last stable offset, high watermark) per \
         partition: {output_ends}",
        missing.len(),
        &missing[..missing.len().min(10)]
    )
}
