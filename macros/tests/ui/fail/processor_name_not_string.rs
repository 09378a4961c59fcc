#[derive(serde::Deserialize, onceflow::Event)]
struct Order {}

#[derive(onceflow::Processor)]
#[processor(name = 5, input_type = Order)]
struct Billing;

fn main() {}
