//! The [`Sum`](onceflow_e2e::sum::Sum) processor charging a card per event, with its
//! effect executor, as one service binary built with `onceflow::run_with_effects`: the
//! role `all` (the default) runs both in one process, `--role processor` or `--role
//! effects` one of them. Charges go to the payment service at `CHARGE_URL`; the output
//! topic is the first of `--outputs`.

use std::process::ExitCode;

use onceflow_e2e::effects::HttpCharge;
use onceflow_e2e::sum::Sum;

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let output = args
        .windows(2)
        .find(|pair| pair[0] == "--outputs")
        .map(|pair| pair[1].clone())
        .unwrap_or_default();
    let Ok(url) = std::env::var("CHARGE_URL") else {
        eprintln!("charge_service: set CHARGE_URL to the payment service");
        return ExitCode::from(2);
    };
    onceflow::run_with_effects(Sum::charging(output), HttpCharge::new(url, false)).await
}
