use onceflow::Event;

#[derive(Event)]
struct Order(String, u64);

#[derive(Event)]
struct Ping;

fn main() {}
