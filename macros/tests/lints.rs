//! The generated code, compiled as part of the workspace: under its lints and
//! `cargo clippy -- -D warnings`, which the trybuild cases in `ui/` escape.
#![warn(clippy::pedantic)]
// The derive awaits the handler, so a handler that awaits nothing is still `async`.
#![allow(clippy::unused_async)]

use std::fmt::Debug;

use onceflow::{Context, Event, Processor, Result};

/// An event with a generic ID, key and payload.
#[derive(Debug, serde::Deserialize, Event)]
pub struct Envelope<I, K, P: Debug> {
    #[event(id)]
    id: Option<I>,
    #[event(key)]
    key: K,
    payload: P,
}

/// A processor with every key of `#[processor(...)]`.
#[derive(Debug, Default, Processor)]
#[processor(
    name = "relay",
    input = "envelopes",
    input_type = Envelope<u64, String, Vec<u8>>,
    outputs = ["relayed", "dropped"],
    handler = relay
)]
pub struct Relay {
    relayed: u64,
}

impl Relay {
    async fn relay(
        &mut self,
        envelope: Envelope<u64, String, Vec<u8>>,
        ctx: &mut Context<'_>,
    ) -> Result<()> {
        self.relayed += 1;
        let topic = if envelope.payload.is_empty() {
            "dropped"
        } else {
            "relayed"
        };
        ctx.emit(topic, &envelope.key, &envelope.payload)
    }
}

/// A generic processor with the default handler.
#[derive(Debug, Processor)]
#[processor(name = "counter", input_type = Envelope<String, u32, ()>)]
pub struct Counter<T: Send + 'static> {
    seen: Vec<T>,
}

impl<T: Send + 'static> Counter<T> {
    async fn handle(&mut self, _: Envelope<String, u32, ()>, _: &mut Context<'_>) -> Result<()> {
        Ok(())
    }
}

#[test]
fn derived_impls_answer_from_the_attributes() {
    let envelope = Envelope {
        id: Some(3_u64),
        key: "k".to_owned(),
        payload: vec![1_u8],
    };
    assert_eq!(envelope.event_id(), Some("3".to_owned()));
    assert_eq!(envelope.key(), Some("k".to_owned()));

    let relay = Relay::default();
    assert_eq!(relay.name(), "relay");
    assert_eq!(relay.input_topic(), Some("envelopes"));
    assert_eq!(relay.output_topics(), &["relayed", "dropped"]);
    assert_eq!(relay.relayed, 0);

    let counter = Counter::<u8> { seen: Vec::new() };
    assert_eq!(counter.name(), "counter");
    assert_eq!(counter.input_topic(), None);
    assert!(counter.output_topics().is_empty() && counter.seen.is_empty());
}
