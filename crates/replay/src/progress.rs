//! The progress bar shown on stderr while a replay runs.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::driver;

/// Progress bar with running ok/failed counts and hit rate.
pub(crate) struct Progress {
    bar: ProgressBar,
    ok: u64,
    failed: u64,
    prompt: u64,
    cached: u64,
}

impl Progress {
    /// A bar for `total` requests, hidden when `quiet` or stderr is not a terminal.
    pub(crate) fn new(total: usize, quiet: bool) -> Self {
        use std::io::IsTerminal as _;
        let target = if quiet || !std::io::stderr().is_terminal() {
            ProgressDrawTarget::hidden()
        } else {
            ProgressDrawTarget::stderr()
        };
        let bar = ProgressBar::with_draw_target(Some(total as u64), target);
        let style = ProgressStyle::with_template(
            "{elapsed_precise} [{bar:30}] {pos}/{len} eta {eta} {msg}",
        )
        .expect("valid template")
        .progress_chars("=> ");
        bar.set_style(style);
        Progress {
            bar,
            ok: 0,
            failed: 0,
            prompt: 0,
            cached: 0,
        }
    }

    /// Counts one finished request.
    pub(crate) fn update(&mut self, o: &driver::RequestOutcome) {
        match (&o.exchange.error, o.exchange.usage) {
            (Some(_), _) => self.failed += 1,
            (None, u) => {
                self.ok += 1;
                let u = u.unwrap_or_default();
                self.prompt += u.prompt_tokens;
                self.cached += u.cached_tokens.unwrap_or(0);
            }
        }
        self.bar.inc(1);
        if (self.ok + self.failed) % 16 == 1 {
            let hit = 100.0 * self.cached as f64 / self.prompt.max(1) as f64;
            self.bar.set_message(format!(
                "ok {} failed {} hit {hit:.1}%",
                self.ok, self.failed
            ));
        }
    }

    /// Removes the bar.
    pub(crate) fn finish(&self) {
        self.bar.finish_and_clear();
    }
}
