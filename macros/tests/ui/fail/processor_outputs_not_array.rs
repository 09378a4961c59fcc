#[derive(serde::Deserialize, onceflow::Event)]
struct Order {}

#[derive(onceflow::Processor)]
#[processor(name = "billing", input_type = Order, outputs = "invoices")]
struct Billing;

fn main() {}
