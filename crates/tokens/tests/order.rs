//! The routing text puts the system prompt, the tools and the conversation in the order the
//! real Qwen3 and Llama 3.2 chat templates render them (Llama 3.2's is Meta's tool-calling
//! template of 3.1; the 3.1 package's own template drops tools), for every endpoint that
//! takes tools. Were the order different, conversations sharing tools but not their system
//! prompt would seem to share a prefix that no engine holds.

mod common;

use prefix_router_core::request::{Endpoint, parse};
use prefix_router_tokens::render::Prompt;
use serde_json::{Value, json};

const MARKS: [&str; 3] = ["SYSMARK", "toolmark", "USERMARK"];

/// Those of `marks` present in `text`, in the order they first appear.
fn order(text: &str, marks: &[&'static str]) -> Vec<&'static str> {
    let mut found: Vec<(usize, &str)> = marks
        .iter()
        .filter_map(|m| text.find(m).map(|at| (at, *m)))
        .collect();
    found.sort();
    found.into_iter().map(|(_, m)| m).collect()
}

/// One body per endpoint and shape of system prompt, each with tools and a user message.
fn bodies() -> Vec<(Endpoint, Value)> {
    let chat_tools = json!([{"type": "function", "function": {"name": "toolmark",
        "description": "d", "parameters": {"type": "object", "properties": {}}}}]);
    let flat_tools = json!([{"type": "function", "name": "toolmark", "description": "d",
        "parameters": {"type": "object", "properties": {}}}]);
    let anthropic_tools = json!([{"name": "toolmark", "description": "d",
        "input_schema": {"type": "object", "properties": {}}}]);
    let user = json!({"role": "user", "content": "USERMARK"});
    vec![
        (
            Endpoint::Chat,
            json!({"tools": chat_tools, "messages": [
                {"role": "system", "content": "SYSMARK"}, user]}),
        ),
        (
            Endpoint::Chat,
            json!({"messages": [user], "tools": chat_tools}),
        ),
        (
            Endpoint::Responses,
            json!({"tools": flat_tools, "input": "USERMARK", "instructions": "SYSMARK"}),
        ),
        (
            Endpoint::Responses,
            json!({"tools": flat_tools, "input": [
                {"role": "system", "content": "SYSMARK"}, user]}),
        ),
        (
            Endpoint::Messages,
            json!({"max_tokens": 8, "tools": anthropic_tools, "system": "SYSMARK",
                "messages": [user]}),
        ),
    ]
}

fn check(name: &str) {
    let model = common::load(name);
    for (endpoint, mut body) in bodies() {
        body["model"] = json!("m");
        let bytes = serde_json::to_vec(&body).unwrap();
        let Prompt::Text { text: rendered, .. } =
            model.renderer().prompt(endpoint, &bytes).unwrap()
        else {
            panic!("a chat renders as text");
        };
        let routed = parse(endpoint, &bytes).unwrap().text.to_vec();
        let routed = String::from_utf8(routed).unwrap();
        let expected = order(&rendered, &MARKS);
        assert!(
            expected.contains(&"toolmark"),
            "{name} {endpoint:?}: {rendered}"
        );
        let routed = order(&routed, &expected);
        assert_eq!(routed, expected, "{name} {endpoint:?}:\n{rendered}");
    }
}

#[test]
fn routing_text_follows_qwen3s_order() {
    check("qwen3");
}

#[test]
fn routing_text_follows_llama3_2s_order() {
    check("llama3_2");
}
