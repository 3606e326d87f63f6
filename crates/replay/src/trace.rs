//! Mooncake JSONL traces: loading and turning them into chat requests.
//!
//! One line per request: `{"timestamp": ms, "input_length": tokens,
//! "output_length": tokens, "hash_ids": [..]}` plus an optional
//! `session_id` (string or number). Each hash id stands for one block of
//! `--block-tokens` tokens; block `j` of a request becomes chat message `j`
//! (system, then user, assistant with a tool call, tool, assistant, repeat),
//! with `block_tokens * bytes_per_token` bytes of text per block and the
//! request cut to `input_length * bytes_per_token` bytes.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use serde::Deserialize;

use super::ReplayError;
use super::plan::{Plan, PlannedTurn, Session};
use super::text::{Role, mix, render_message, text, truncate_on_char};

/// Domain separator for block text seeds.
const BLOCK_SEED: u64 = 0xB10C;
/// Parent of the first block of every request.
const ROOT: u32 = u32::MAX;

/// One trace line.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct TraceRecord {
    /// Arrival, ms from the start of the trace.
    pub(crate) timestamp_ms: f64,
    /// Prompt length in tokens.
    pub(crate) input_length: u64,
    /// Completion length in tokens (sent as `max_tokens`).
    pub(crate) output_length: u64,
    /// One id per block of prompt.
    pub(crate) hash_ids: Vec<u64>,
    /// Optional session id.
    pub(crate) session_id: Option<Arc<str>>,
}

#[derive(Deserialize)]
struct Line {
    timestamp: f64,
    input_length: u64,
    output_length: u64,
    hash_ids: Vec<u64>,
    #[serde(default)]
    session_id: Option<serde_json::Value>,
}

/// Reads a trace, sorted by timestamp (stable), keeping the first `limit` requests.
pub(crate) fn read_trace(
    path: &Path,
    limit: Option<usize>,
) -> Result<Vec<TraceRecord>, ReplayError> {
    let data = std::fs::read_to_string(path).map_err(|cause| ReplayError::Io {
        path: path.to_path_buf(),
        cause,
    })?;
    let mut out = parse_trace(&data).map_err(|(line, msg)| ReplayError::TraceLine {
        path: path.to_path_buf(),
        line,
        msg,
    })?;
    out.sort_by(|a, b| a.timestamp_ms.total_cmp(&b.timestamp_ms));
    if let Some(n) = limit {
        out.truncate(n);
    }
    Ok(out)
}

/// Parses JSONL text; errors carry the 1-based line number.
pub(crate) fn parse_trace(data: &str) -> Result<Vec<TraceRecord>, (usize, String)> {
    let mut out = Vec::new();
    for (i, line) in data.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let rec = parse_line(line).map_err(|msg| (i + 1, msg))?;
        out.push(rec);
    }
    Ok(out)
}

fn parse_line(line: &str) -> Result<TraceRecord, String> {
    let l: Line = serde_json::from_str(line).map_err(|e| e.to_string())?;
    if l.hash_ids.is_empty() || l.input_length == 0 {
        return Err("empty request (no hash_ids or input_length 0)".into());
    }
    if !l.timestamp.is_finite() || l.timestamp < 0.0 {
        return Err("timestamp must be a non-negative number".into());
    }
    let session_id = match l.session_id {
        None | Some(serde_json::Value::Null) => None,
        Some(serde_json::Value::String(s)) => Some(Arc::from(s)),
        Some(v) => Some(Arc::from(v.to_string())),
    };
    Ok(TraceRecord {
        timestamp_ms: l.timestamp,
        input_length: l.input_length,
        output_length: l.output_length,
        hash_ids: l.hash_ids,
        session_id,
    })
}

/// Builds the plan for `records`: one single-turn session per request.
pub(crate) fn plan_trace(
    records: Vec<TraceRecord>,
    block_tokens: u32,
    bytes_per_token: u32,
) -> Plan {
    let mut b = Builder {
        plan: Plan::default(),
        nodes: HashMap::new(),
        block_tokens: u64::from(block_tokens),
        bytes_per_token: u64::from(bytes_per_token),
    };
    for r in records {
        let turn = b.turn(&r);
        b.plan.sessions.push(Session {
            id: r.session_id,
            start_ms: r.timestamp_ms,
            turns: vec![turn],
        });
    }
    b.plan.finish()
}

struct Builder {
    plan: Plan,
    /// (parent node, hash id) -> piece of the full block.
    nodes: HashMap<(u32, u64), u32>,
    block_tokens: u64,
    bytes_per_token: u64,
}

impl Builder {
    fn turn(&mut self, r: &TraceRecord) -> PlannedTurn {
        let block_bytes = self.block_tokens * self.bytes_per_token;
        let target = r.input_length * self.bytes_per_token;
        let n = (r.hash_ids.len() as u64).min(target.div_ceil(block_bytes)) as usize;
        let mut pieces = Vec::with_capacity(n);
        let (mut parent, mut parent_id) = (ROOT, 0);
        for (j, &id) in r.hash_ids[..n].iter().enumerate() {
            let node = self.node(parent, j, id, parent_id);
            let start = j as u64 * block_bytes;
            if start + block_bytes > target {
                let tokens = r.input_length - j as u64 * self.block_tokens;
                let role = role_at(j, id, parent_id);
                pieces.push(self.tail(node, role, id, target - start, tokens));
            } else {
                pieces.push(node);
            }
            (parent, parent_id) = (node, id);
        }
        PlannedTurn {
            pieces,
            max_tokens: u32::try_from(r.output_length).unwrap_or(u32::MAX).max(1),
            think_ms: 0.0,
            prompt_tokens: r.input_length,
            overlaps: false,
        }
    }

    /// The piece of the full block `id` at depth `j` under `parent`.
    fn node(&mut self, parent: u32, j: usize, id: u64, parent_id: u64) -> u32 {
        if let Some(&p) = self.nodes.get(&(parent, id)) {
            return p;
        }
        let bytes = (self.block_tokens * self.bytes_per_token) as usize;
        let json = render_message(role_at(j, id, parent_id), &block_text(id, bytes));
        let p = self.plan.push_piece(json, None, self.block_tokens as u32);
        self.nodes.insert((parent, id), p);
        p
    }

    /// A final block cut to `bytes`; counts as its full block for the bound.
    fn tail(&mut self, node: u32, role: Role, id: u64, bytes: u64, tokens: u64) -> u32 {
        let full = (self.block_tokens * self.bytes_per_token) as usize;
        let mut t = block_text(id, full);
        truncate_on_char(&mut t, bytes as usize);
        self.plan
            .push_piece(render_message(role, &t), Some(node), tokens as u32)
    }
}

/// The text of block `id`: exactly `bytes` bytes, the same on every call.
pub(crate) fn block_text(id: u64, bytes: usize) -> String {
    text(mix(BLOCK_SEED, id), bytes)
}

/// Role of message `j` (block `j`): system, then user, assistant with a tool
/// call, tool result, assistant, and again from user.
fn role_at(j: usize, id: u64, parent_id: u64) -> Role {
    match j {
        0 => Role::System,
        _ => match (j - 1) % 4 {
            0 => Role::User,
            1 => Role::AssistantCall { call: id },
            2 => Role::Tool { call: parent_id },
            _ => Role::Assistant,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::BodyStyle;

    const SAMPLE: &str = r#"{"timestamp": 0, "input_length": 1000, "output_length": 5, "hash_ids": [0, 1]}

{"timestamp": 27.5, "input_length": 700, "output_length": 3, "hash_ids": [0, 2], "session_id": "s1"}
{"timestamp": 12, "input_length": 10, "output_length": 0, "hash_ids": [9], "session_id": 17}
"#;

    #[test]
    fn parses_mooncake_lines() {
        let recs = parse_trace(SAMPLE).unwrap();
        assert_eq!(recs.len(), 3);
        assert_eq!(recs[0].hash_ids, vec![0, 1]);
        assert_eq!(recs[1].timestamp_ms, 27.5);
        assert_eq!(recs[1].session_id.as_deref(), Some("s1"));
        assert_eq!(recs[2].session_id.as_deref(), Some("17"));
        assert_eq!(recs[0].session_id, None);
    }

    #[test]
    fn reports_bad_line_number() {
        let err = parse_trace(
            "{\"timestamp\":0,\"input_length\":1,\"output_length\":1,\"hash_ids\":[1]}\n{oops}\n",
        );
        assert_eq!(err.unwrap_err().0, 2);
        let err =
            parse_trace(r#"{"timestamp":0,"input_length":5,"output_length":1,"hash_ids":[]}"#);
        assert_eq!(err.unwrap_err().0, 1);
    }

    #[test]
    fn blocks_have_exact_lengths() {
        let plan = plan_trace(parse_trace(SAMPLE).unwrap(), 512, 4);
        let turn = &plan.sessions[0].turns[0];
        let texts: Vec<String> = turn.pieces.iter().map(|&p| content(&plan, p)).collect();
        assert_eq!(texts[0].len(), 2048);
        assert_eq!(texts[0], block_text(0, 2048));
        // 1000 tokens * 4 = 4000 bytes; the second block is cut to 1952 (or up to 2 less).
        assert!((1950..=1952).contains(&texts[1].len()));
        assert!(block_text(1, 2048).starts_with(&texts[1]));
    }

    fn content(plan: &Plan, p: u32) -> String {
        let v: serde_json::Value = serde_json::from_str(&plan.pieces[p as usize]).unwrap();
        v["content"].as_str().unwrap().to_string()
    }

    #[test]
    fn shared_prefix_gives_identical_body_prefix() {
        let ids_a: Vec<u64> = (0..9).collect();
        let mut ids_b = ids_a[..6].to_vec();
        ids_b.extend([100, 101, 102]);
        let recs = vec![rec(&ids_a, 9 * 16), rec(&ids_b, 9 * 16)];
        let plan = plan_trace(recs, 16, 4);
        let style = BodyStyle::new("m", true);
        let a = plan.body(&style, &plan.sessions[0].turns[0]);
        let b = plan.body(&style, &plan.sessions[1].turns[0]);
        let common = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
        let v: serde_json::Value = serde_json::from_slice(&a).unwrap();
        let msgs = v["messages"].as_array().unwrap();
        let first6: Vec<String> = msgs[..6].iter().map(|m| m.to_string()).collect();
        let upto = r#"{"model":"m","messages":["#.len() + first6.join(",").len();
        assert!(common >= upto, "common {common} < {upto}");
        assert!(common < upto + 40, "bodies diverge within message 7");
        let roles: Vec<&str> = msgs.iter().map(|m| m["role"].as_str().unwrap()).collect();
        assert_eq!(
            roles[..6],
            ["system", "user", "assistant", "tool", "assistant", "user"]
        );
        assert_eq!(msgs[3]["tool_call_id"], msgs[2]["tool_calls"][0]["id"]);
    }

    fn rec(ids: &[u64], input: u64) -> TraceRecord {
        TraceRecord {
            timestamp_ms: 0.0,
            input_length: input,
            output_length: 4,
            hash_ids: ids.to_vec(),
            session_id: None,
        }
    }
}
