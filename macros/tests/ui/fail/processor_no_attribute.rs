#[derive(onceflow::Processor)]
struct FraudCheck;

fn main() {}
