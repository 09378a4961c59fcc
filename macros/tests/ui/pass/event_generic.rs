use std::fmt::Debug;

use onceflow::Event;

/// The payload's type is free; the ID and key fields' types get their bounds from the derive.
#[derive(Event)]
struct Envelope<'a, I, K, P: Debug>
where
    P: Clone,
{
    #[event(id)]
    id: I,
    #[event(key)]
    key: K,
    source: &'a str,
    payload: P,
}

/// A generic struct whose ID field does not depend on the parameter.
#[derive(Event)]
struct Tagged<T> {
    #[event(id)]
    id: String,
    value: T,
}

fn id_of(event: &impl Event) -> Option<String> {
    event.event_id()
}

fn main() {
    let envelope = Envelope {
        id: 9_u64,
        key: "k",
        source: "test",
        payload: vec![1, 2],
    };
    assert_eq!(id_of(&envelope), Some("9".into()));
    assert_eq!(envelope.key(), Some("k".into()));
    assert_eq!((envelope.source, envelope.payload), ("test", vec![1, 2]));

    let none: Envelope<'_, Option<String>, char, ()> = Envelope {
        id: None,
        key: 'x',
        source: "test",
        payload: (),
    };
    assert_eq!(none.event_id(), None);
    assert_eq!(none.key(), Some("x".into()));

    let tagged = Tagged {
        id: "t-1".into(),
        value: [0_u8; 4],
    };
    assert_eq!(tagged.event_id(), Some("t-1".into()));
    assert_eq!(tagged.value, [0; 4]);
}
