//! Lines in, a running count per word out: the hello-world of stream processing.
//!
//! Counts live in the processor's state, which is scoped to an input partition: produce
//! lines keyed by what should be counted together (a document, a source), or use a
//! one-partition `lines` topic for one global count. Lines need no ID: a record is then
//! deduplicated by its offset (redelivery after a crash), or by the `onceflow-event-id`
//! header when the producer sets one.
use onceflow::{Context, Event, Processor, Result};
use serde::{Deserialize, Serialize};

#[derive(Event, Deserialize, Debug)]
pub struct Line {
    pub text: String,
}

#[derive(Serialize, Deserialize, Debug, PartialEq, Eq)]
pub struct WordCount {
    pub word: String,
    pub count: u64,
}

#[derive(Processor, Debug, Clone)]
#[processor(name = "word-count", input = "lines", input_type = Line, outputs = ["word-counts"])]
pub struct WordCounter;

impl WordCounter {
    async fn handle(&mut self, line: Line, ctx: &mut Context<'_>) -> Result<()> {
        let words = line
            .text
            .split(|c: char| !c.is_alphanumeric())
            .filter(|w| !w.is_empty());
        for word in words.map(str::to_lowercase) {
            let count = ctx.state().get::<u64>(&word)?.unwrap_or(0) + 1;
            ctx.state().put(&word, &count)?;
            ctx.emit(
                Self::WORD_COUNTS,
                &word,
                &WordCount {
                    word: word.clone(),
                    count,
                },
            )?;
        }
        Ok(())
    }
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    onceflow::run(WordCounter).await
}

/// Driver tests: the processor over the engine's own code, no broker.
#[cfg(test)]
mod tests {
    use onceflow::testing::{OutgoingRecord, TestDriver};

    use super::*;

    fn line(text: &str) -> OutgoingRecord {
        OutgoingRecord::keyed("doc-1", format!("{{\"text\":\"{text}\"}}"))
    }

    #[tokio::test]
    async fn words_are_counted_once_per_line_and_a_redelivered_line_counts_once() -> Result<()> {
        let mut driver = TestDriver::new(WordCounter);
        driver.pipe_record(line("to be, or not to be"));
        let (partition, offset) = driver.pipe_record(line("Be quick"));
        // A line without an ID redelivered at its own offset (a consumer's replay) is the
        // same record; written again by a producer it is a new one, and counts again.
        driver.process().await?;
        driver.restart()?;
        driver.process().await?;
        assert_eq!(driver.state::<u64>(partition, "be")?, Some(3));
        driver.pipe_again(partition, offset);
        driver.process().await?;
        assert_eq!(driver.state::<u64>(partition, "be")?, Some(4));
        let counts: Vec<WordCount> = driver.output_values(WordCounter::WORD_COUNTS)?;
        assert_eq!(counts.len(), 10);
        assert_eq!(driver.stats().without_event_id, 3);
        Ok(())
    }
}
