//! The `Sum` processor charging a card per event, with its
//! effect executor, as one service binary built with
//! `onceflow::run_with_effects_and_settings`: the role `all` (the default) runs both in
//! one process, `--role processor` or `--role effects` one of them. The payment
//! service's address is an application setting (`--app payment_url=…`,
//! `ONCEFLOW_APP_PAYMENT_URL` or `payment_url` under `[app]`); the output topic is the
//! first of `--outputs`.

use std::process::ExitCode;

use onceflow_e2e::effects::HttpCharge;
use onceflow_e2e::sum::Sum;

/// The application's own settings.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Charging {
    /// Where the payment service listens.
    payment_url: String,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let output = args
        .windows(2)
        .find(|pair| pair[0] == "--outputs")
        .map(|pair| pair[1].clone())
        .unwrap_or_default();
    onceflow::run_with_effects_and_settings(move |app: Charging| {
        (
            Sum::charging(output),
            HttpCharge::new(app.payment_url, false),
        )
    })
    .await
}
