use onceflow::Event;

#[derive(Event)]
struct Payment {
    #[event(id)]
    sequence: u64,
}

#[derive(Event)]
struct Refund {
    #[event(id)]
    sequence: i32,
}

fn main() {
    assert_eq!(Payment { sequence: 42 }.event_id(), Some("42".into()));
    assert_eq!(Refund { sequence: -7 }.event_id(), Some("-7".into()));
}
