use onceflow::Event;

#[derive(Event)]
struct Order {
    #[event(id)]
    order_id: String,
    #[event(id)]
    payment_id: String,
}

fn main() {}
