//! A child process's log, read line by line on a thread of its own as it is written, so a
//! test can wait for a line (with a deadline) instead of sleeping and hoping it landed.

use std::io::{BufRead, BufReader, Read};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// The lines read so far.
pub struct Log {
    lines: Arc<(Mutex<Vec<String>>, Condvar)>,
}

impl Log {
    /// Starts reading `stream` (a child's stderr) until it closes.
    pub fn read(stream: impl Read + Send + 'static) -> Log {
        let lines = Arc::new((Mutex::new(Vec::new()), Condvar::new()));
        let writer = Arc::clone(&lines);
        std::thread::spawn(move || {
            for line in BufReader::new(stream).lines().map_while(Result::ok) {
                writer.0.lock().unwrap().push(line);
                writer.1.notify_all();
            }
        });
        Log { lines }
    }

    /// Waits until a line containing `needle` was read, at most `timeout`; returns whether
    /// one was.
    pub fn wait_for(&self, needle: &str, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let (lines, written) = &*self.lines;
        let mut seen = lines.lock().unwrap();
        loop {
            if seen.iter().any(|l| l.contains(needle)) {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            seen = written.wait_timeout(seen, left).unwrap().0;
        }
    }

    /// Every line read so far, joined.
    pub fn text(&self) -> String {
        self.lines.0.lock().unwrap().join("\n")
    }
}
