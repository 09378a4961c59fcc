use onceflow::Event;

#[derive(Event)]
struct Order {
    #[event(identifier)]
    id: String,
}

fn main() {}
