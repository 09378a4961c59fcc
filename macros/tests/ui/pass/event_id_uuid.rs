use onceflow::Event;

#[derive(Event)]
struct Transfer {
    #[event(id)]
    id: uuid::Uuid,
}

fn main() {
    let id = uuid::Uuid::from_u128(0x0123_4567_89ab_cdef_0123_4567_89ab_cdef);
    assert_eq!(
        Transfer { id }.event_id(),
        Some("01234567-89ab-cdef-0123-456789abcdef".into())
    );
}
