//! Events: what a processor consumes, how it is decoded, and how duplicates are recognised.

use serde::Serialize;
use serde::de::DeserializeOwned;

/// A decoded input event.
///
/// An event may carry a business **event ID** (a payment ID, an order ID): two records
/// with the same ID on the same input partition are the same event, and the second is
/// skipped. Without an ID (here or in the `onceflow-event-id` header) a record is
/// deduplicated by its offset only, which covers redelivery after a crash but not a
/// producer that sent the same event twice.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not an onceflow `Event`",
    label = "the processor's input type must implement `onceflow::Event`",
    note = "add `#[derive(onceflow::Event)]` (with `#[event(id)]` on the ID field), or implement `onceflow::Event` by hand (both methods have defaults)"
)]
pub trait Event {
    /// The event's business ID, if it has one.
    fn event_id(&self) -> Option<String> {
        None
    }

    /// The event's key, if it has one: what [`crate::Context::emit_event`] keys the
    /// record with (so one key's events stay on one partition, in order).
    fn key(&self) -> Option<String> {
        None
    }
}

/// A field type that can serve as an event ID (`#[event(id)]` of `#[derive(Event)]`):
/// strings, integers, `uuid::Uuid` (feature `uuid`), and `Option`s of them (`None`: the
/// event has no ID and is deduplicated by offset only). Implement it for your own ID type
/// to use that; the ID is compared as the returned string.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be an event ID",
    label = "this field is marked `#[event(id)]`",
    note = "use a String, an integer, a uuid::Uuid (feature `uuid`), an Option of one, or implement `onceflow::EventId`"
)]
pub trait EventId {
    /// The ID as text, or `None` when there is none.
    fn to_event_id(&self) -> Option<String>;
}

impl EventId for String {
    fn to_event_id(&self) -> Option<String> {
        Some(self.clone())
    }
}

impl EventId for str {
    fn to_event_id(&self) -> Option<String> {
        Some(self.to_owned())
    }
}

impl<T: EventId + ?Sized> EventId for &T {
    fn to_event_id(&self) -> Option<String> {
        (**self).to_event_id()
    }
}

impl<T: EventId> EventId for Option<T> {
    fn to_event_id(&self) -> Option<String> {
        self.as_ref().and_then(EventId::to_event_id)
    }
}

macro_rules! integer_event_ids {
    ($($t:ty),*) => {$(
        impl EventId for $t {
            fn to_event_id(&self) -> Option<String> {
                Some(self.to_string())
            }
        }
    )*};
}
integer_event_ids!(
    u8, u16, u32, u64, u128, usize, i8, i16, i32, i64, i128, isize
);

#[cfg(feature = "uuid")]
impl EventId for uuid::Uuid {
    fn to_event_id(&self) -> Option<String> {
        Some(self.hyphenated().to_string())
    }
}

/// Turns values into bytes and back, through serde. [`Json`] is the default; a processor
/// reads its input with another one through [`crate::Processor::decode_input`] (or
/// `#[processor(codec = MyCodec)]`) and emits with one through
/// [`crate::Context::emit_with`]. State values stay JSON.
pub trait Codec: Send + Sync + 'static {
    /// Decodes `bytes` into a `T`, or says why not.
    fn decode<T: DeserializeOwned>(&self, bytes: &[u8]) -> Result<T, String>;
    /// Encodes `value`, or says why not.
    fn encode<T: Serialize + ?Sized>(&self, value: &T) -> Result<Vec<u8>, String>;
}

/// JSON through serde.
#[derive(Debug, Clone, Copy, Default)]
pub struct Json;

impl Codec for Json {
    fn decode<T: DeserializeOwned>(&self, bytes: &[u8]) -> Result<T, String> {
        serde_json::from_slice(bytes).map_err(|e| e.to_string())
    }

    fn encode<T: Serialize + ?Sized>(&self, value: &T) -> Result<Vec<u8>, String> {
        serde_json::to_vec(value).map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
    struct Order {
        id: String,
        amount: i64,
    }

    #[test]
    fn event_ids_come_from_strings_integers_and_options() {
        assert_eq!("o-1".to_owned().to_event_id(), Some("o-1".to_owned()));
        assert_eq!(42u64.to_event_id(), Some("42".to_owned()));
        assert_eq!((-7i32).to_event_id(), Some("-7".to_owned()));
        assert_eq!(Some(5u8).to_event_id(), Some("5".to_owned()));
        assert_eq!(None::<String>.to_event_id(), None);
    }

    #[test]
    fn json_round_trips_and_names_what_is_wrong() {
        let order = Order {
            id: "o-1".into(),
            amount: 5,
        };
        let bytes = Json.encode(&order).expect("encode");
        assert_eq!(Json.decode::<Order>(&bytes).expect("decode"), order);
        let error = Json
            .decode::<Order>(b"{\"id\":\"o-1\"}")
            .expect_err("missing field");
        assert!(error.contains("amount"), "{error}");
    }
}
