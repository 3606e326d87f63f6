//! [`Workload`]: a trace or generated workload, prepared once and reusable
//! across runs.

use std::path::PathBuf;
use std::sync::Arc;

use super::agent::{AgentConfig, plan_agent};
use super::bound::Bound;
use super::plan::Plan;
use super::template::plan_template;
use super::trace::{plan_trace, read_trace};
use super::{ReplayArgs, ReplayError, Synthetic};

/// A prepared workload (text rendered, schedule fixed). Cheap to share:
/// the plan is behind an [`Arc`].
#[derive(Debug, Clone)]
pub enum Workload {
    /// A Mooncake JSONL trace.
    Trace {
        /// The trace file.
        path: PathBuf,
        /// Its prepared requests.
        plan: Arc<Plan>,
    },
    /// Generated coding-agent sessions.
    Agent {
        /// The generator settings.
        config: AgentConfig,
        /// The generated requests.
        plan: Arc<Plan>,
    },
    /// Generated few-shot requests (sessions are requests, system prompts are templates).
    Template {
        /// The generator settings.
        config: AgentConfig,
        /// The generated requests.
        plan: Arc<Plan>,
    },
}

impl Workload {
    /// Loads the trace (`--trace`, cut to `--max-requests`) or generates the
    /// synthetic workload (`--synthetic`), rendering all text up front.
    pub fn load(args: &ReplayArgs) -> Result<Self, ReplayError> {
        if args.block_tokens == 0 || args.bytes_per_token == 0 {
            return Err(ReplayError::InvalidArg(
                "--block-tokens and --bytes-per-token must be >= 1".into(),
            ));
        }
        let w = match (&args.trace, args.synthetic) {
            (Some(_), Some(_)) => {
                return Err(ReplayError::InvalidArg(
                    "give --trace or --synthetic, not both".into(),
                ));
            }
            (None, None) => return Err(ReplayError::NoWorkload),
            (Some(path), None) => {
                let recs = read_trace(path, args.max_requests)?;
                let plan = plan_trace(recs, args.block_tokens, args.bytes_per_token);
                Workload::Trace {
                    path: path.clone(),
                    plan: Arc::new(plan),
                }
            }
            (None, Some(Synthetic::Agent)) => {
                let config = args.agent_config();
                let plan = Arc::new(plan_agent(&config));
                Workload::Agent { config, plan }
            }
            (None, Some(Synthetic::Template)) => {
                let config = args.agent_config();
                let plan = Arc::new(plan_template(&config));
                Workload::Template { config, plan }
            }
        };
        if w.is_empty() {
            return Err(ReplayError::EmptyWorkload);
        }
        Ok(w)
    }

    /// The prepared plan.
    pub fn plan(&self) -> &Arc<Plan> {
        match self {
            Workload::Trace { plan, .. }
            | Workload::Agent { plan, .. }
            | Workload::Template { plan, .. } => plan,
        }
    }

    /// Best possible token-weighted prefix hit rate over the whole workload
    /// with one infinite cache, 0..=1 (see [`Bound`]).
    pub fn bound(&self) -> f64 {
        self.bound_detail().hit_rate
    }

    /// The best hit rate with all backends' caches pooled into one LRU cache of
    /// `capacity_tokens` (see `bound::compute_pooled`), for requests in schedule order with
    /// answers taking no time (a run, whose answers take time, interleaves sessions more).
    pub fn pooled_bound(&self, capacity_tokens: u64) -> f64 {
        let plan = self.plan();
        super::bound::compute_pooled(plan, plan.schedule_order().into_iter(), capacity_tokens)
    }

    /// The bound with its token and block counts.
    pub fn bound_detail(&self) -> Bound {
        let plan = self.plan();
        super::bound::compute(plan, plan.schedule_order().into_iter())
    }

    /// Number of requests.
    pub fn len(&self) -> usize {
        self.plan().len()
    }

    /// Whether there are no requests.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A one-line description, e.g. `conversation_trace.jsonl (12031 requests)`.
    pub fn describe(&self) -> String {
        match self {
            Workload::Trace { path, .. } => {
                let name = path.file_name().map_or_else(
                    || path.display().to_string(),
                    |n| n.to_string_lossy().into_owned(),
                );
                format!("{name} ({} requests)", self.len())
            }
            Workload::Agent { config, plan } => format!(
                "synthetic agent ({} sessions, {} requests, seed {})",
                plan.sessions.len(),
                self.len(),
                config.seed
            ),
            Workload::Template { config, .. } => format!(
                "synthetic template ({} requests over {} templates, seed {})",
                self.len(),
                config.system_prompts,
                config.seed
            ),
        }
    }

    /// The bound as printed by `--bound`.
    pub fn bound_summary(&self) -> String {
        let b = self.bound_detail();
        format!(
            "{}: best possible prefix hit rate {:.2}% ({} of {} prompt tokens; one infinite cache, \
             token-weighted); blocks seen earlier {:.2}%",
            self.describe(),
            b.hit_rate * 100.0,
            b.hit_tokens,
            b.prompt_tokens,
            b.blocks_seen_rate * 100.0
        )
    }
}
