//! How many bytes of routing text make one token of a backend's prompts, learned from what
//! it reports. In text mode the router measures prompts in bytes of routing text, while a
//! backend publishes its KV and reports its prompts in its tokenizer's tokens. A fixed
//! [`TEXT_BYTES_PER_TOKEN`] is right for English prose and the simulator, but Qwen3's
//! tokenizer makes a token of about 2.2 bytes of the agent workload's routing text (what
//! this learns in front of the simulator with Qwen3's tokenizer): at 4, the router saw
//! room for far more than the engines held, piled conversations onto backends whose caches
//! then thrashed, and left one backend idle (`benches/real_vllm/run.sh`, real vLLM). Each
//! response of a text-mode request teaches its backend's density; capacities, index
//! budgets and reported hits are converted at it. Token mode needs none of it: its sizes
//! are the engine's tokens.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::units::{TEXT_BYTES_PER_TOKEN, TextBytes, TextPerToken, Tokens};

/// Prompts shorter than this teach nothing: the template's own tokens weigh too much.
const MIN_PROMPT: Tokens = Tokens(256);

/// Weight of each new response in the learned density.
const ALPHA: f64 = 0.05;

/// Densities outside this range are taken as a mismatch of request and report, not learned.
const RANGE: std::ops::RangeInclusive<f64> = 0.5..=32.0;

/// A backend's learned density (its bits in an atomic: read on every placement).
#[derive(Debug)]
pub struct Density(AtomicU64);

impl Default for Density {
    fn default() -> Self {
        Density(AtomicU64::new((TEXT_BYTES_PER_TOKEN as f64).to_bits()))
    }
}

impl Density {
    /// The density now: [`TEXT_BYTES_PER_TOKEN`] until a report taught otherwise.
    pub fn get(&self) -> TextPerToken {
        TextPerToken(f64::from_bits(self.0.load(Relaxed)))
    }

    /// A text-mode request of `routed` routing text was reported as `prompt` tokens.
    pub fn learn(&self, routed: TextBytes, prompt: Tokens) {
        if prompt < MIN_PROMPT {
            return;
        }
        let seen = routed.0 as f64 / prompt.0 as f64;
        if !RANGE.contains(&seen) {
            return;
        }
        let step = |bits: u64| {
            let now = f64::from_bits(bits);
            Some((now + ALPHA * (seen - now)).to_bits())
        };
        let _ = self.0.fetch_update(Relaxed, Relaxed, step);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_teach_the_density_and_odd_ones_are_ignored() {
        let density = Density::default();
        assert_eq!(density.get(), TextPerToken(4.0));
        density.learn(TextBytes(100), Tokens(10)); // too short to count
        density.learn(TextBytes(1 << 30), Tokens(1000)); // not this request's report
        assert_eq!(density.get(), TextPerToken(4.0));
        for _ in 0..200 {
            density.learn(TextBytes(27_000), Tokens(10_000));
        }
        let TextPerToken(learned) = density.get();
        assert!((learned - 2.7).abs() < 0.01, "{learned}");
        assert_eq!(density.get().text(Tokens(1000)), TextBytes(2700));
    }
}
