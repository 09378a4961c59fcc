use onceflow::Event;

#[derive(Event)]
struct Heartbeat {
    at_ms: i64,
}

fn main() {
    let beat = Heartbeat { at_ms: 1 };
    assert_eq!(beat.event_id(), None);
    assert_eq!(beat.key(), None);
    assert_eq!(beat.at_ms, 1);
}
