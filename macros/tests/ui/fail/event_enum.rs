use onceflow::Event;

#[derive(Event)]
enum Command {
    Start { id: String },
    Stop { id: String },
}

fn main() {}
