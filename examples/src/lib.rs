//! Runnable onceflow processors users can copy: billing, bank transfer, word count and
//! the quickstart arrive with the runner. Each is a binary under `src/bin/`.
