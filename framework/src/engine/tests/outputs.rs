//! What reaches an output topic: a renamed output's records go to the configured topic, a
//! record carries the headers and timestamp its processor gives it, an event is keyed by
//! its own key.

use crate::config::DeliveryMode;
use crate::{Context, Processor, Result};

use super::batch_rig::{DLQ, In, OUT, Rig, amount, record};

/// Emits each input as it came, keyed by the event's own key.
struct Forward;

#[async_trait::async_trait]
impl Processor for Forward {
    type Input = In;

    fn name(&self) -> &str {
        "forward"
    }

    async fn process(&mut self, input: In, ctx: &mut Context<'_>) -> Result<()> {
        ctx.emit_event(OUT, &input)
    }
}

/// Issue 16, part 3: the processor emits to its declared name (`out`, what
/// `Self::OUT` would be); the configuration renamed it, so the record goes to the
/// configured topic, and the declared name's own topic gets nothing.
#[tokio::test]
async fn an_emit_to_a_renamed_output_goes_to_the_configured_topic() {
    let mut rig = Rig::new(DeliveryMode::ExactlyOnce);
    rig.config = rig.config.clone().rename_output(OUT, "prod.out");
    rig.declared = ["prod.out".to_owned()].into();
    rig.limits.insert("prod.out".into(), 1_000_000);
    rig.run(vec![amount(0, "a", 1), amount(1, "b", 2)])
        .await
        .expect("batch");
    assert_eq!(rig.kafka.committed("prod.out").len(), 2);
    assert!(rig.kafka.committed(OUT).is_empty());
}

/// Issue 16, part 4: a processor emits a record with headers and its own timestamp
/// (here the input's event time, a day back); both reach the output as given, and the
/// headers count against the topic's size limit like the key and value.
#[tokio::test]
async fn an_output_carries_the_headers_and_timestamp_the_processor_gives_it() {
    struct Tagger;

    #[async_trait::async_trait]
    impl Processor for Tagger {
        type Input = In;

        fn name(&self) -> &str {
            "tagger"
        }

        async fn process(&mut self, input: In, ctx: &mut Context<'_>) -> Result<()> {
            let at = ctx.record().timestamp_ms.unwrap_or_default() - 86_400_000;
            let record = crate::processor::OutputRecord::json(&input.amount)?
                .key(input.key.clone())
                .header("source-offset", ctx.offset().to_string())
                .header("tag", "x".repeat(input.big_state))
                .timestamp_ms(at);
            ctx.emit_record(OUT, record)
        }
    }

    let mut rig = Rig::new(DeliveryMode::ExactlyOnce);
    let mut first = amount(0, "a", 1);
    first.timestamp_ms = Some(1_796_000_000_000);
    rig.batch()
        .run(&mut Tagger, vec![first])
        .await
        .expect("batch");
    let out = rig.kafka.committed(OUT);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].header("source-offset").as_deref(), Some("0"));
    assert_eq!(out[0].timestamp_ms, Some(1_796_000_000_000 - 86_400_000));
    assert_eq!(out[0].key.as_deref(), Some(&b"k"[..]));

    // Headers count: a header that takes the record over the limit fails the record
    // before its transaction, as a large value does.
    rig.limits.insert(OUT.into(), 300);
    let big = record(
        1,
        In {
            id: Some("b".into()),
            key: "k".into(),
            amount: 2,
            big_state: 500,
            ..In::default()
        },
    );
    rig.batch()
        .run(&mut Tagger, vec![big])
        .await
        .expect("batch");
    assert_eq!(
        rig.kafka.committed(OUT).len(),
        1,
        "the big one was not output"
    );
    assert_eq!(rig.kafka.committed(DLQ).len(), 1, "it was dead-lettered");
}

#[tokio::test]
async fn an_emitted_event_is_keyed_by_its_own_key() {
    let rig = Rig::new(DeliveryMode::ExactlyOnce);
    let keyless = In {
        id: Some("b".into()),
        ..In::default()
    };
    rig.batch()
        .run(&mut Forward, vec![amount(0, "a", 1), record(1, keyless)])
        .await
        .expect("batch");
    let keys: Vec<Option<Vec<u8>>> = rig
        .kafka
        .committed(OUT)
        .into_iter()
        .map(|r| r.key)
        .collect();
    assert_eq!(
        keys,
        [Some(b"k".to_vec()), None],
        "the event's key, or none"
    );
}
