//! A processor that fails on purpose, for the dead-letter tests.

use std::collections::HashMap;

use onceflow::{Context, Error, Event, Processor, Result};
use serde::{Deserialize, Serialize};

/// How the processor treats an order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Behaviour {
    /// Processed normally.
    #[default]
    Fine,
    /// A permanent processing error.
    Permanent,
    /// The handler panics.
    Panic,
    /// Transient errors until the given attempt, which succeeds (0: never).
    Transient(u32),
    /// Emits an extra output of this many bytes.
    Huge(usize),
    /// Stores a state value of this many bytes.
    HugeState(usize),
    /// Takes this many milliseconds.
    Slow(u64),
}

/// An input order.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct Order {
    /// Event ID.
    pub id: String,
    /// Key.
    pub key: String,
    /// What the processor will do with it.
    #[serde(default)]
    pub behaviour: Behaviour,
}

impl Event for Order {
    fn event_id(&self) -> Option<String> {
        Some(self.id.clone())
    }
}

/// Emits each fine order's ID to `output`; fails on the others as they ask.
#[derive(Debug)]
pub struct Picky {
    output: String,
    attempts: HashMap<String, u32>,
    fixed: bool,
}

impl Picky {
    /// A processor writing to `output`.
    pub fn new(output: impl Into<String>) -> Self {
        Picky {
            output: output.into(),
            attempts: HashMap::new(),
            fixed: false,
        }
    }

    /// The same processor after the fix: it accepts what it refused.
    pub fn fixed(output: impl Into<String>) -> Self {
        Picky {
            fixed: true,
            ..Picky::new(output)
        }
    }
}

#[onceflow::async_trait]
impl Processor for Picky {
    type Input = Order;

    fn name(&self) -> &str {
        "picky"
    }

    async fn process(&mut self, order: Order, ctx: &mut Context<'_>) -> Result<()> {
        let attempt = {
            let n = self.attempts.entry(order.id.clone()).or_default();
            *n += 1;
            *n
        };
        match order.behaviour {
            Behaviour::Fine | Behaviour::Huge(_) => {}
            Behaviour::HugeState(bytes) => {
                ctx.state()
                    .put(&format!("{}-blob", order.key), &"x".repeat(bytes))?;
            }
            Behaviour::Slow(ms) => tokio::time::sleep(std::time::Duration::from_millis(ms)).await,
            Behaviour::Permanent if self.fixed => {}
            Behaviour::Permanent => {
                return Err(Error::processing(format!("order {} refused", order.id)));
            }
            Behaviour::Panic => panic!("order {} made the handler panic", order.id),
            Behaviour::Transient(succeed_on) => {
                if succeed_on == 0 || attempt < succeed_on {
                    return Err(Error::transient(format!(
                        "order {} not yet (attempt {attempt})",
                        order.id
                    )));
                }
            }
        }
        if let Behaviour::Huge(bytes) = order.behaviour {
            ctx.emit(&self.output, &order.key, &"x".repeat(bytes))?;
        }
        let count = ctx.state().get::<u64>(&order.key)?.unwrap_or(0) + 1;
        ctx.state().put(&order.key, &count)?;
        ctx.emit(&self.output, &order.key, &order.id)
    }
}
