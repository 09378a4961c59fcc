//! A member of a consumer group that is not the engine's input consumer: the outbox
//! relay's membership (whoever holds the progress topic's one partition is the active
//! relay) and the half-message checker (the group shares the halves' partitions out).
//!
//! It never commits offsets on its own. Its generation ([`GroupMetadata`]) goes into a
//! transaction's offsets, so a member that lost its turn cannot commit (KIP-447).

use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, ConsumerGroupMetadata};

use super::{ClientOptions, Record, kafka_error, types::to_record};
use crate::{Error, Result};

/// A member's generation in its group, as a transaction's offsets carry it.
pub(crate) struct GroupMetadata(pub(super) ConsumerGroupMetadata);

impl GroupMetadata {
    /// The generation of `consumer`, a member of its group.
    pub(super) fn of<C: ConsumerContext>(consumer: &impl Consumer<C>) -> Result<Self> {
        consumer
            .group_metadata()
            .map(GroupMetadata)
            .ok_or_else(|| Error::Broker("the consumer has no group metadata yet".into()))
    }
}

impl std::fmt::Debug for GroupMetadata {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GroupMetadata")
    }
}

/// Where a new member starts reading a partition its group has no offset for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Start {
    /// At the partition's start (what is left of a compacted topic is what matters).
    Earliest,
    /// At its end (the member is there for its membership, not for the records).
    #[cfg_attr(not(feature = "outbox"), allow(dead_code))]
    Latest,
}

/// A group member subscribed to one topic (see the [module](self)). Poll it often: a
/// member that is not polled leaves the group when `max.poll.interval.ms` passes.
pub(crate) struct GroupMember {
    consumer: BaseConsumer,
    group: String,
}

impl std::fmt::Debug for GroupMember {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupMember")
            .field("group", &self.group)
            .finish_non_exhaustive()
    }
}

impl GroupMember {
    /// Joins `group` subscribed to `topic`, reading committed records only, with offsets
    /// never committed automatically; `session_timeout` if given (else the client's).
    pub(crate) fn join(
        options: &ClientOptions,
        group: &str,
        topic: &str,
        start: Start,
        session_timeout: Option<Duration>,
    ) -> Result<Self> {
        let session_ms = session_timeout.map(|t| t.as_millis().to_string());
        let mut settings = vec![
            ("group.id", group),
            ("enable.auto.commit", "false"),
            ("isolation.level", "read_committed"),
            (
                "auto.offset.reset",
                match start {
                    Start::Earliest => "earliest",
                    Start::Latest => "latest",
                },
            ),
        ];
        if let Some(ms) = &session_ms {
            settings.push(("session.timeout.ms", ms));
        }
        let consumer: BaseConsumer = options
            .config(&settings)
            .create()
            .map_err(|e| kafka_error(format!("join the group `{group}`"), e))?;
        consumer
            .subscribe(&[topic])
            .map_err(|e| kafka_error(format!("subscribe to `{topic}` in `{group}`"), e))?;
        Ok(GroupMember {
            consumer,
            group: group.to_owned(),
        })
    }

    /// The next record already fetched, or an error librdkafka reported, or `None`: it
    /// does not wait. Rebalances happen inside it.
    pub(crate) fn poll(&self) -> Option<Result<Record>> {
        self.consumer.poll(Duration::ZERO).map(|polled| {
            polled
                .map(|message| to_record(&message))
                .map_err(|e| kafka_error(format!("poll the group `{}`", self.group), e))
        })
    }

    /// The partitions the group gave this member.
    pub(crate) fn assigned(&self) -> Result<Vec<i32>> {
        let list = self
            .consumer
            .assignment()
            .map_err(|e| kafka_error(format!("the assignment in `{}`", self.group), e))?;
        Ok(list.elements().iter().map(|e| e.partition()).collect())
    }

    /// Whether the group gave this member any partition.
    #[cfg_attr(not(feature = "outbox"), allow(dead_code))]
    pub(crate) fn owns_partitions(&self) -> bool {
        self.assigned()
            .is_ok_and(|partitions| !partitions.is_empty())
    }

    /// The member's current generation, for a transaction's offsets.
    #[cfg_attr(not(feature = "outbox"), allow(dead_code))]
    pub(crate) fn group_metadata(&self) -> Result<GroupMetadata> {
        GroupMetadata::of(&self.consumer)
    }
}
