use onceflow::Event;

/// `None`: the event has no ID and is deduplicated by its offset only.
#[derive(Event)]
struct Click {
    #[event(id)]
    id: Option<String>,
}

fn main() {
    assert_eq!(
        Click {
            id: Some("c-1".into())
        }
        .event_id(),
        Some("c-1".into())
    );
    assert_eq!(Click { id: None }.event_id(), None);
}
