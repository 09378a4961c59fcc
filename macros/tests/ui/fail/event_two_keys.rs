use onceflow::Event;

#[derive(Event)]
struct Order {
    #[event(key)]
    customer: String,
    #[event(key)]
    region: String,
}

fn main() {}
