//! The intent side of effects: what a handler's [`Context::effect`](crate::Context::effect)
//! records in the batch's transaction, and the idempotency key that names it in every
//! attempt. The executor ([`super::executor`]) reads these; this module knows nothing of
//! it, nor of the processor, so the user API can stand on it.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::event::Event;

/// A side effect a processor recorded, as the executor receives it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Intent {
    /// The operator (consumer group) that recorded it.
    pub operator: String,
    /// What to do, as the processor named it (`"charge"`, `"notify-warehouse"`).
    pub kind: String,
    /// The ordering key: effects of one key are applied in the order recorded.
    pub key: String,
    /// The same in every attempt: hand it to the outside system.
    pub idempotency_key: String,
    /// What the processor passed.
    pub payload: serde_json::Value,
}

impl Intent {
    pub(crate) fn recorded<V: Serialize + ?Sized>(
        operator: &str,
        kind: &str,
        key: &str,
        idempotency_key: &str,
        payload: &V,
    ) -> Result<Intent> {
        let payload = serde_json::to_value(payload).map_err(|e| Error::Encode {
            what: format!("the payload of a `{kind}` effect"),
            message: e.to_string(),
            cause: Some(Box::new(e)),
        })?;
        Ok(Intent {
            operator: operator.to_owned(),
            kind: kind.to_owned(),
            key: key.to_owned(),
            idempotency_key: idempotency_key.to_owned(),
            payload,
        })
    }
}

impl Event for Intent {
    // The executor deduplicates intents by their key, like any onceflow processor.
    fn event_id(&self) -> Option<String> {
        Some(self.idempotency_key.clone())
    }
}

/// Where an effect was recorded: the event and, for one without an ID, its input position.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RecordedAt<'a> {
    pub(crate) event_id: Option<&'a str>,
    pub(crate) topic: &'a str,
    pub(crate) partition: i32,
    pub(crate) offset: i64,
}

/// The idempotency key of the `index`-th effect recorded while processing the record
/// `at` names: `operator/event-id/index`, or `operator/topic-partition@offset/index` for
/// an event without an ID.
pub(crate) fn idempotency_key(operator: &str, at: RecordedAt<'_>, index: u32) -> String {
    match at.event_id {
        Some(id) => format!("{operator}/{id}/{index}"),
        None => format!(
            "{operator}/{}-{}@{}/{index}",
            at.topic, at.partition, at.offset
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(event_id: Option<&str>) -> RecordedAt<'_> {
        RecordedAt {
            event_id,
            topic: "payments",
            partition: 2,
            offset: 41,
        }
    }

    #[test]
    fn idempotency_keys_come_from_the_operator_the_event_and_the_index() {
        assert_eq!(
            idempotency_key("billing", at(Some("e-7")), 0),
            "billing/e-7/0"
        );
        assert_eq!(
            idempotency_key("billing", at(Some("e-7")), 3),
            "billing/e-7/3"
        );
        // Without an event ID, the input position: the same in every attempt.
        assert_eq!(
            idempotency_key("billing", at(None), 1),
            "billing/payments-2@41/1"
        );
    }
}
