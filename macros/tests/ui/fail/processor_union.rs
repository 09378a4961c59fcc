#[derive(serde::Deserialize, onceflow::Event)]
struct Order {}

#[derive(onceflow::Processor)]
#[processor(name = "billing", input_type = Order)]
union Billing {
    count: u64,
}

fn main() {}
