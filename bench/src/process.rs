//! A contender's processes, seen from outside: CPU seconds and peak RSS from `/proc`.

use std::path::Path;
use std::process::{Child, Command, Stdio};

/// Processes of one contender (one per instance), killed when dropped.
#[derive(Debug)]
pub struct Contender {
    children: Vec<Child>,
    ticks_per_second: f64,
}

/// CPU and memory of a contender's processes at one moment.
#[derive(Debug, Clone, Copy, Default)]
pub struct Usage {
    /// User plus system CPU seconds, summed over the instances.
    pub cpu_seconds: f64,
    /// The largest peak resident set (VmHWM) of any instance, in MiB.
    pub peak_rss_mib: f64,
}

impl Contender {
    /// Starts `commands`, one process each, their output appended to `log`.
    pub fn start(commands: Vec<Command>, log: &Path) -> std::io::Result<Contender> {
        let mut children = Vec::new();
        for mut command in commands {
            let file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(log)?;
            command
                .stdin(Stdio::null())
                .stdout(file.try_clone()?)
                .stderr(file);
            children.push(command.spawn()?);
        }
        Ok(Contender {
            children,
            ticks_per_second: clock_ticks(),
        })
    }

    /// Whether every process still runs (one that exited has failed: they run until killed).
    pub fn alive(&mut self) -> bool {
        self.children
            .iter_mut()
            .all(|child| matches!(child.try_wait(), Ok(None)))
    }

    /// CPU time so far and peak RSS so far.
    pub fn usage(&self) -> Usage {
        let mut usage = Usage::default();
        for child in &self.children {
            let pid = child.id();
            if let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) {
                // Fields after the parenthesised command name; utime and stime are the
                // 14th and 15th of the whole line.
                let rest = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
                let fields: Vec<&str> = rest.split_whitespace().collect();
                let ticks: f64 = [11, 12]
                    .iter()
                    .filter_map(|&i| fields.get(i)?.parse::<f64>().ok())
                    .sum();
                usage.cpu_seconds += ticks / self.ticks_per_second;
            }
            if let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) {
                let kib = status
                    .lines()
                    .find_map(|line| line.strip_prefix("VmHWM:"))
                    .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
                    .unwrap_or(0.0);
                usage.peak_rss_mib = usage.peak_rss_mib.max(kib / 1024.0);
            }
        }
        usage
    }
}

impl Drop for Contender {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Clock ticks per second of `/proc/<pid>/stat` (`getconf CLK_TCK`, 100 on Linux).
fn clock_ticks() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|out| String::from_utf8(out.stdout).ok())
        .and_then(|text| text.trim().parse().ok())
        .unwrap_or(100.0)
}
