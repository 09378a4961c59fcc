#[derive(onceflow::Processor)]
#[processor(name = "billing", input = "orders")]
struct Billing;

fn main() {}
