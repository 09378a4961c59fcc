use onceflow::Event;

#[derive(Event)]
struct Reading {
    #[event(id)]
    value: f64,
}

fn main() {}
