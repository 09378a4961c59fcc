//! Derive macros for onceflow: `#[derive(Event)]` and `#[derive(Processor)]`.
//!
//! Use them through `onceflow` (feature `derive`, on by default), which re-exports both next
//! to the traits they implement: `use onceflow::{Event, Processor};`. The generated code
//! names onceflow's items only through `::onceflow::__private`, so it needs the `onceflow`
//! crate under that name and nothing else in scope.
//!
//! - `src/attr.rs` reads `#[event(...)]` and `#[processor(...)]`, collecting every mistake
//!   with the user's span;
//! - `src/event.rs` and `src/processor.rs` expand one derive each.

use proc_macro::TokenStream;

mod attr;
mod event;
mod processor;

/// Implements `onceflow::Event` for a struct with named fields.
///
/// - `#[event(id)]` on at most one field: its value is the event's business ID, by which
///   duplicates are recognised. The field's type implements `onceflow::EventId`: a
///   `String`, an integer, a `uuid::Uuid` (feature `uuid`), an `Option` of one (`None`: no
///   ID, the record is deduplicated by its offset only), or your own type.
/// - `#[event(key)]` on at most one field: the event's key for logs, through `ToString`.
///
/// Without either attribute both are `None`.
///
/// ```
/// use onceflow::Event;
///
/// #[derive(serde::Deserialize, Event)]
/// struct Order {
///     #[event(id)]
///     id: String,
///     #[event(key)]
///     customer: String,
///     amount: i64,
/// }
///
/// let order = Order { id: "o-1".into(), customer: "c-7".into(), amount: 5 };
/// assert_eq!(order.event_id(), Some("o-1".to_owned()));
/// assert_eq!(order.key(), Some("c-7".to_owned()));
/// ```
#[proc_macro_derive(Event, attributes(event))]
pub fn derive_event(input: TokenStream) -> TokenStream {
    expand(input, event::expand)
}

/// Implements `onceflow::Processor` from a `#[processor(...)]` attribute, with `process`
/// forwarding to an inherent `async fn` of the type.
///
/// | key | value | |
/// |---|---|---|
/// | `name` | string literal | required: the processor's name in logs and metrics |
/// | `input_type` | type | required: the decoded input event (`Processor::Input`) |
/// | `input` | string literal | the topic it consumes (`Processor::input_topic`) |
/// | `outputs` | array of string literals | the topics it emits to (`Processor::output_topics`), each also a `Topic` constant of the type |
/// | `handler` | method name | the method `process` calls; `handle` by default |
/// | `codec` | a value implementing `onceflow::Codec` | what the input is decoded with (`Processor::decode_input`); JSON by default |
/// | `timer` | method name | the method `on_timer` calls (`async fn(&mut self, timer: onceflow::Timer, ctx)`); the processor then uses timers (`Processor::uses_timers`) |
///
/// The handler has the signature of `Processor::process`:
/// `async fn handle(&mut self, input: Order, ctx: &mut onceflow::Context<'_>) -> onceflow::Result<()>`.
///
/// ```
/// use onceflow::{Context, Event, Processor, Result};
///
/// #[derive(serde::Deserialize, Event)]
/// struct Order {
///     #[event(id)]
///     id: String,
///     #[event(key)]
///     customer: String,
///     amount: i64,
/// }
///
/// #[derive(Processor)]
/// #[processor(name = "billing", input = "orders", input_type = Order, outputs = ["invoices"])]
/// struct Billing;
///
/// impl Billing {
///     async fn handle(&mut self, order: Order, ctx: &mut Context<'_>) -> Result<()> {
///         let total = ctx.state().get::<i64>(&order.customer)?.unwrap_or(0) + order.amount;
///         ctx.state().put(&order.customer, &total)?;
///         ctx.emit(Self::INVOICES, &order.customer, &total)
///     }
/// }
///
/// assert_eq!(Billing.name(), "billing");
/// assert_eq!(Billing.input_topic(), Some("orders"));
/// assert_eq!(Billing.output_topics(), &["invoices"]);
/// assert_eq!(Billing::INVOICES.name(), "invoices");
/// ```
#[proc_macro_derive(Processor, attributes(processor))]
pub fn derive_processor(input: TokenStream) -> TokenStream {
    expand(input, processor::expand)
}

/// Parses the item, expands it, and turns any error into `compile_error!`s: the one place
/// where that happens.
fn expand(
    input: TokenStream,
    expand: fn(&syn::DeriveInput) -> syn::Result<proc_macro2::TokenStream>,
) -> TokenStream {
    syn::parse::<syn::DeriveInput>(input)
        .and_then(|input| expand(&input))
        .unwrap_or_else(syn::Error::into_compile_error)
        .into()
}
