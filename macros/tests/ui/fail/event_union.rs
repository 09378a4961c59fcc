use onceflow::Event;

#[derive(Event)]
union Bits {
    int: u64,
    float: f64,
}

fn main() {}
