use onceflow::Event;

#[derive(Event)]
struct Order {
    #[event(id)]
    id: String,
    amount: i64,
}

fn main() {
    let order = Order {
        id: "o-1".into(),
        amount: 5,
    };
    assert_eq!(Event::event_id(&order), Some("o-1".into()));
    assert_eq!(Event::key(&order), None);
    assert_eq!(order.amount, 5);
}
