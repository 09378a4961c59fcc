use onceflow::Event;

#[derive(Event)]
#[event(id)]
struct Order {
    #[event]
    id: String,
    #[event(key = "customer")]
    customer: String,
}

fn main() {}
