use onceflow::{Context, Processor, Result};

#[derive(serde::Deserialize, onceflow::Event)]
struct Tick {
    at_ms: i64,
}

#[derive(Processor)]
#[processor(name = "ticker", input_type = Tick)]
struct Ticker;

impl Ticker {
    async fn handle(&mut self, tick: Tick, _ctx: &mut Context<'_>) -> Result<()> {
        assert!(tick.at_ms >= 0);
        Ok(())
    }
}

/// Generic and enum processors go through the same derive.
#[derive(Processor)]
#[processor(name = "generic", input_type = Tick)]
struct Generic<T: Send + 'static> {
    seen: Vec<T>,
}

impl<T: Send + 'static> Generic<T> {
    async fn handle(&mut self, _tick: Tick, _ctx: &mut Context<'_>) -> Result<()> {
        Ok(())
    }
}

#[derive(Processor)]
#[processor(name = "mode", input_type = Tick)]
enum Mode {
    Fast,
}

impl Mode {
    async fn handle(&mut self, _tick: Tick, _ctx: &mut Context<'_>) -> Result<()> {
        match self {
            Mode::Fast => Ok(()),
        }
    }
}

fn main() {
    assert_eq!(Ticker.name(), "ticker");
    assert_eq!(Ticker.input_topic(), None);
    assert!(Ticker.output_topics().is_empty());
    assert!(!Ticker.uses_timers(), "no `timer = ...`: no timers");

    let generic = Generic::<String> { seen: Vec::new() };
    assert_eq!(generic.name(), "generic");
    assert!(generic.seen.is_empty());
    assert_eq!(Mode::Fast.name(), "mode");
}
