//! The [`Sum`] processor as a service binary built with `onceflow::run`: every setting
//! comes from the runner's flags, `ONCEFLOW_*` variables or `--config` file, as in a user's
//! deployment. The output topic is the first of `--outputs` (or `ONCEFLOW_OUTPUTS`); the
//! input and group are not declared, so tests choose them (`--input`, `--group`).

use std::process::ExitCode;

use onceflow_e2e::sum::Sum;

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let from_flag = args
        .windows(2)
        .find(|pair| pair[0] == "--outputs")
        .map(|pair| pair[1].clone());
    let output = from_flag
        .or_else(|| std::env::var("ONCEFLOW_OUTPUTS").ok())
        .unwrap_or_default();
    let output = output.split(',').next().unwrap_or_default().to_owned();
    onceflow::run(Sum::new(output)).await
}
