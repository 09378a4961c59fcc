#[derive(serde::Deserialize, onceflow::Event)]
struct Order {}

#[derive(onceflow::Processor)]
#[processor(name = "billing", input_type = "Order", input = orders, handler = "on_order")]
struct Billing;

fn main() {}
