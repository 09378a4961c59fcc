//! Re-publishing dead-lettered records after a fix.

use std::time::Duration;

use crate::Result;
use crate::config::EngineConfig;
use crate::kafka::{self, ClientOptions, ReplayPlan};

/// Re-publishes records of an operator's dead-letter topic to the topic they came from
/// and partition (headers `onceflow-source-topic`, `onceflow-source-partition`), exactly
/// once: run it after fixing the processor. A dead letter whose value was left out
/// (`onceflow-value-omitted`: over the size limit) is passed over with a warning.
///
/// The replay has its own consumer group (`<group>-dlq-replay`) whose offsets commit in
/// the same transaction as the re-published records, so running it again re-publishes
/// only what was dead-lettered since. Re-published records carry their original key,
/// value and headers, and `onceflow-replayed-from: <dlq>/<partition>@<offset>`.
#[derive(Debug, Clone)]
pub struct DeadLetterReplay {
    options: ClientOptions,
    plan: ReplayPlan,
}

/// What a replay did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReplaySummary {
    /// Records re-published.
    pub replayed: u64,
    /// Records read but left out by the filters.
    pub passed_over: u64,
}

impl DeadLetterReplay {
    /// A replay of the dead letters of the operator `config` describes.
    pub fn new(config: &EngineConfig) -> Self {
        let group = format!("{}-dlq-replay", config.group);
        DeadLetterReplay {
            options: ClientOptions::with_properties(
                &config.bootstrap_servers,
                &config.kafka_properties,
            ),
            plan: ReplayPlan {
                dead_letter_topic: config.dead_letter_topic(),
                transactional_id: group.clone(),
                group,
                target: None,
                error_class: None,
                offsets: None,
                timeout: Duration::from_secs(60),
            },
        }
    }

    /// Uses the consumer group (and transactional ID) `name` instead of
    /// `<group>-dlq-replay`. Records a filter leaves out are passed over for good by the
    /// group that read them; a replay with another group reads the topic afresh.
    pub fn group(mut self, name: impl Into<String>) -> Self {
        let name = name.into();
        self.plan.transactional_id = name.clone();
        self.plan.group = name;
        self
    }

    /// Only records dead-lettered with this error class (e.g. `permanent`).
    pub fn error_class(mut self, class: impl Into<String>) -> Self {
        self.plan.error_class = Some(class.into());
        self
    }

    /// Only records at dead-letter offsets `from..=to`.
    pub fn offsets(mut self, from: i64, to: i64) -> Self {
        self.plan.offsets = Some((from, to));
        self
    }

    /// Re-publish to `topic` instead of each record's source topic.
    pub fn to_topic(mut self, topic: impl Into<String>) -> Self {
        self.plan.target = Some(topic.into());
        self
    }

    /// Runs the replay to the current end of the dead-letter topic. Refused credentials
    /// and missing ACLs stop it as they stop the engine ([`crate::Error::Authentication`],
    /// [`crate::Error::Unauthorized`]).
    pub async fn run(self) -> Result<ReplaySummary> {
        kafka::check_connection(&self.options, Duration::from_secs(30)).await?;
        let options = self.options.clone();
        let names = kafka::Resources {
            group: self.plan.group.clone(),
            transactional_id: Some(self.plan.transactional_id.clone()),
            input: self.plan.dead_letter_topic.clone(),
            writes: self.plan.target.iter().cloned().collect(),
        };
        let (replayed, passed_over) = kafka::replay_dead_letters(&self.options, &self.plan)
            .await
            .map_err(|error| kafka::explain(error, &options, &names))?;
        Ok(ReplaySummary {
            replayed,
            passed_over,
        })
    }
}
