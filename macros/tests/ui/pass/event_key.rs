use onceflow::Event;

#[derive(Event)]
struct Order {
    #[event(id)]
    id: String,
    #[event(key)]
    customer: u32,
}

/// A key without an ID.
#[derive(Event)]
struct Reading {
    #[event(key)]
    sensor: String,
    celsius: f64,
}

fn main() {
    let order = Order {
        id: "o-1".into(),
        customer: 7,
    };
    assert_eq!(order.event_id(), Some("o-1".into()));
    assert_eq!(order.key(), Some("7".into()));

    let reading = Reading {
        sensor: "s-1".into(),
        celsius: 21.5,
    };
    assert_eq!(reading.event_id(), None);
    assert_eq!(reading.key(), Some("s-1".into()));
    assert_eq!(reading.celsius, 21.5);
}
