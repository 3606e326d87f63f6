//! Synthetic few-shot traffic (`--synthetic template`): independent single-turn requests
//! that share a long prefix *beyond* their first user message (a system prompt, then fixed
//! example questions and answers), each ending with a question of its own. A hot shared
//! prefix that is not one conversation: a router must spread it, not follow it. Requests
//! arrive as a Poisson process; everything is a pure function of the config (seed).

use super::agent::{AgentConfig, exponential, tokens};
use super::plan::{Plan, PlannedTurn, Session};
use super::text::{Rng, Role, mix, render_message, text};

/// Example question-answer pairs in each template.
const EXAMPLES: usize = 4;

/// Generates the plan: `cfg.sessions` requests at `cfg.session_rate` per second over
/// `cfg.system_prompts` templates.
pub(crate) fn plan_template(cfg: &AgentConfig) -> Plan {
    let mut plan = Plan::default();
    let bpt = u64::from(cfg.bytes_per_token.max(1));
    let mut rng = Rng::new(mix(cfg.seed, 0x7E3A));
    let templates: Vec<Vec<u32>> = (0..cfg.system_prompts.max(1))
        .map(|_| template(&mut plan, &mut rng, bpt))
        .collect();
    let mut start_s = 0.0;
    for _ in 0..cfg.sessions {
        start_s += exponential(&mut rng, cfg.session_rate);
        let mut pieces = templates[rng.range(0, templates.len() as u64 - 1) as usize].clone();
        let question = render_message(
            Role::User,
            &text(rng.next_u64(), rng.range(200, 2_000) as usize),
        );
        let t = tokens(question.len(), bpt);
        pieces.push(plan.push_piece(question, None, t));
        let prompt_tokens = pieces
            .iter()
            .map(|&p| u64::from(plan.piece_tokens[p as usize]))
            .sum();
        plan.sessions.push(Session {
            id: None,
            start_ms: start_s * 1000.0,
            turns: vec![PlannedTurn {
                pieces,
                max_tokens: rng.range(30, 300) as u32,
                think_ms: 0.0,
                prompt_tokens,
                overlaps: false,
            }],
        });
    }
    plan.finish()
}

/// One template's shared pieces: a system prompt and example exchanges.
fn template(plan: &mut Plan, rng: &mut Rng, bpt: u64) -> Vec<u32> {
    let push = |plan: &mut Plan, role: Role, len: usize, seed: u64| {
        let json = render_message(role, &text(seed, len));
        let t = tokens(json.len(), bpt);
        plan.push_piece(json, None, t)
    };
    let mut pieces = vec![push(
        plan,
        Role::System,
        rng.range(20_000, 40_000) as usize,
        rng.next_u64(),
    )];
    for _ in 0..EXAMPLES {
        pieces.push(push(
            plan,
            Role::User,
            rng.range(500, 2_000) as usize,
            rng.next_u64(),
        ));
        pieces.push(push(
            plan,
            Role::Assistant,
            rng.range(500, 2_000) as usize,
            rng.next_u64(),
        ));
    }
    pieces
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_share_a_prefix_beyond_their_first_user_message() {
        let cfg = AgentConfig {
            sessions: 50,
            system_prompts: 1,
            session_rate: 10.0,
            ..AgentConfig::default()
        };
        let plan = plan_template(&cfg);
        assert_eq!(plan.len(), 50);
        let first = &plan.sessions[0].turns[0].pieces;
        let second = &plan.sessions[1].turns[0].pieces;
        assert_eq!(first[..1 + 2 * EXAMPLES], second[..1 + 2 * EXAMPLES]);
        assert_ne!(first.last(), second.last());
        let bound = crate::bound::compute(&plan, plan.schedule_order().into_iter()).hit_rate;
        assert!(bound > 0.8, "bound {bound}");
    }
}
