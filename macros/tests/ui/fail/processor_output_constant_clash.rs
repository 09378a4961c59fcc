#[derive(serde::Deserialize, onceflow::Event)]
struct Order {}

#[derive(onceflow::Processor)]
#[processor(name = "billing", input_type = Order, outputs = ["audit-log", "audit.log", "bad topic"])]
struct Billing;

fn main() {}
