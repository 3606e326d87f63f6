//! Tests of request parsing: what each endpoint's routing text holds, the errors, that parts
//! borrow the body, and (proptest) that turn N+1's text extends turn N's for every endpoint.

use proptest::prelude::*;
use serde_json::{Value, json};

use super::*;

fn text_of(endpoint: Endpoint, body: &Value) -> Vec<u8> {
    let bytes = serde_json::to_vec(body).unwrap();
    parse(endpoint, &bytes).unwrap().text.to_vec()
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w == needle.as_bytes())
}

fn position(haystack: &[u8], needle: &str) -> usize {
    let found = haystack
        .windows(needle.len())
        .position(|w| w == needle.as_bytes());
    found.unwrap_or_else(|| panic!("{needle} not in text"))
}

#[test]
fn chat_text_has_every_message_in_order_with_tools_after_the_system_prompt() {
    let body = json!({
        "model": "m",
        "tools": [{"type": "function", "function": {"name": "read_file"}}],
        "messages": [
            {"role": "system", "content": "SYS"},
            {"role": "user", "content": [{"type": "text", "text": "U1"},
                                         {"type": "image_url", "image_url": {"url": "data:xyz"}}]},
            {"role": "assistant", "content": null,
             "tool_calls": [{"id": "c1", "type": "function",
                             "function": {"name": "read_file", "arguments": "{\"p\":1}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "RESULT"},
            {"role": "assistant", "content": "A2"}
        ]
    });
    let text = text_of(Endpoint::Chat, &body);
    let order = [
        "SYS",
        "<tools>",
        "U1",
        "<image:",
        "read_file(",
        r#"{\"p\":1}"#,
        "RESULT",
        "A2",
    ];
    let positions: Vec<usize> = order.iter().map(|n| position(&text, n)).collect();
    assert!(positions.windows(2).all(|w| w[0] < w[1]), "{positions:?}");
    assert!(
        !contains(&text, "data:xyz"),
        "media bytes must not be routed on"
    );
}

#[test]
fn media_parts_are_digests_of_their_data() {
    let with = |url: &str| {
        let part = json!({"type": "image_url", "image_url": {"url": url}});
        text_of(
            Endpoint::Chat,
            &json!({"messages": [{"role": "user", "content": [part]}]}),
        )
    };
    assert_eq!(with("data:a"), with("data:a"));
    assert_ne!(with("data:a"), with("data:b"));
}

#[test]
fn model_and_body_session_are_read() {
    let body = br#"{"model":"llama","session_params":{"session_id":"s1"},"messages":[{"role":"user","content":"hi"}]}"#;
    let parsed = parse(Endpoint::Chat, body).unwrap();
    assert_eq!(parsed.model, b"llama");
    assert_eq!(parsed.sessions.session_params, Some(&b"s1"[..]));
    assert!(
        contains(&parsed.text.to_vec(), "hi"),
        "session must not displace text"
    );
}

#[test]
fn the_agents_body_sessions_are_read() {
    let body = json!({"model": "m", "prompt_cache_key": "thread-1", "input": "hi"});
    let bytes = serde_json::to_vec(&body).unwrap();
    let parsed = parse(Endpoint::Responses, &bytes).unwrap();
    assert_eq!(parsed.sessions.prompt_cache_key, Some(&b"thread-1"[..]));
    let user_id = r#"{"device_id":"d","account_uuid":"","session_id":"s-7"}"#;
    let body = json!({"model": "m", "max_tokens": 8, "metadata": {"user_id": user_id},
        "messages": [{"role": "user", "content": "hi"}]});
    let bytes = serde_json::to_vec(&body).unwrap();
    let parsed = parse(Endpoint::Messages, &bytes).unwrap();
    assert_eq!(parsed.sessions.metadata_user_id, Some(&b"s-7"[..]));
}

/// A Messages body and the chat vLLM turns it into route on the same text: the system
/// prompt first (the billing line dropped), an inline system message where it stands,
/// tool results as tool messages before their user's own text.
#[test]
fn messages_route_on_the_text_of_the_chat_vllm_makes() {
    let messages = json!({"model": "m", "max_tokens": 8,
        "system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=1; cch=ab12;"},
                   {"type": "text", "text": "SYS", "cache_control": {"type": "ephemeral"}}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "U1"}]},
            {"role": "system", "content": "S2"},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "hmm"},
                                              {"type": "text", "text": "A1"}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "R"}]},
                {"type": "text", "text": "U2"}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t2", "content": "R2"}]}]});
    let chat = json!({"model": "m", "messages": [
        {"role": "system", "content": "SYS"},
        {"role": "user", "content": "U1"},
        {"role": "system", "content": "S2"},
        {"role": "assistant", "content": "A1"},
        {"role": "tool", "tool_call_id": "t1", "content": "R"},
        {"role": "user", "content": "U2"},
        {"role": "tool", "tool_call_id": "t2", "content": "R2"}]});
    let text = text_of(Endpoint::Messages, &messages);
    assert_eq!(
        String::from_utf8_lossy(&text),
        String::from_utf8_lossy(&text_of(Endpoint::Chat, &chat))
    );
    let bytes = serde_json::to_vec(&messages).unwrap();
    let parsed = parse(Endpoint::CountTokens, &bytes).unwrap();
    assert!(parsed.text.to_vec()[..parsed.text.anchor_len()].ends_with(b"U1"));
    let calls = json!({"tools": [{"name": "read", "input_schema": {}}], "messages": [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "read", "input": {"p": 1}},
                                          {"type": "image", "source": {"type": "base64", "data": "QUJD"}}]}]});
    let text = text_of(Endpoint::Messages, &calls);
    let order = ["<tools>", "go", "<image:", "read(", r#"{"p":1}"#];
    let positions: Vec<usize> = order.iter().map(|n| position(&text, n)).collect();
    assert!(positions.windows(2).all(|w| w[0] < w[1]), "{positions:?}");
    assert!(
        !contains(&text, "QUJD"),
        "media bytes must not be routed on"
    );
}

#[test]
fn anchor_ends_at_first_user_message() {
    let body = json!({"messages": [
        {"role": "system", "content": "S"}, {"role": "user", "content": "U"},
        {"role": "assistant", "content": "A"}]});
    let bytes = serde_json::to_vec(&body).unwrap();
    let parsed = parse(Endpoint::Chat, &bytes).unwrap();
    let text = parsed.text.to_vec();
    assert!(text[..parsed.text.anchor_len()].ends_with(b"U"));
    assert!(!parsed.text.is_opening(), "a later turn");
    let opening = json!({"tools": [{"type": "function", "function": {"name": "f"}}],
        "messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]});
    let bytes = serde_json::to_vec(&opening).unwrap();
    assert!(parse(Endpoint::Chat, &bytes).unwrap().text.is_opening());
    let prompt = serde_json::to_vec(&json!({"prompt": "P"})).unwrap();
    let completion = parse(Endpoint::Completions, &prompt).unwrap();
    assert!(!completion.text.is_opening(), "a prompt names no turns");
}

#[test]
fn completions_prompt_shapes() {
    let text = |prompt: Value| text_of(Endpoint::Completions, &json!({ "prompt": prompt }));
    assert!(contains(&text(json!("hello")), "hello"));
    let strings = text(json!(["a1", "b2"]));
    assert!(position(&strings, "a1") < position(&strings, "b2"));
    assert!(text(json!([1, 2, 3])).starts_with(b"[1,2"));
    assert!(text(json!([[1, 2], [3]])).starts_with(b"[1,2"));
}

#[test]
fn responses_items_in_order() {
    let body = json!({
        "instructions": "INSTR",
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "Q1"}]},
            {"type": "function_call", "call_id": "c", "name": "grep", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c", "output": "OUT"},
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "THINK"}]},
            {"type": "message", "role": "assistant",
             "content": [{"type": "output_text", "text": "ANS"}]}
        ]
    });
    let text = text_of(Endpoint::Responses, &body);
    let order = ["INSTR", "Q1", "grep(", "OUT", "THINK", "ANS"];
    let positions: Vec<usize> = order.iter().map(|n| position(&text, n)).collect();
    assert!(positions.windows(2).all(|w| w[0] < w[1]), "{positions:?}");
    let plain = text_of(Endpoint::Responses, &json!({"input": "just text"}));
    assert!(contains(&plain, "just text"));
}

fn error_of(endpoint: Endpoint, body: &[u8]) -> ParseError {
    parse(endpoint, body).expect_err("must be refused")
}

#[test]
fn bad_bodies_are_typed_errors() {
    use Endpoint::*;
    assert!(matches!(error_of(Chat, b"\xff\xfe"), ParseError::NotUtf8));
    assert!(matches!(error_of(Chat, b"{"), ParseError::Syntax { .. }));
    assert!(matches!(error_of(Chat, b"[]"), ParseError::Syntax { .. }));
    assert!(matches!(
        error_of(Chat, b"{\"messages\":[{\"role\":\"user\"}]} x"),
        ParseError::Syntax { .. }
    ));
    let twice = br#"{"model":"a","model":"b","messages":[{"role":"user","content":"x"}]}"#;
    assert!(matches!(
        error_of(Chat, twice),
        ParseError::Duplicate("model")
    ));
    assert!(matches!(
        error_of(Chat, b"{}"),
        ParseError::Missing("messages")
    ));
    assert!(matches!(
        error_of(Chat, br#"{"messages":[]}"#),
        ParseError::Empty(_)
    ));
    assert!(matches!(
        error_of(Chat, br#"{"messages":"x"}"#),
        ParseError::WrongType { .. }
    ));
    let no_role = br#"{"messages":[{"content":"x"}]}"#;
    assert!(matches!(error_of(Chat, no_role), ParseError::Missing(_)));
    let bad_content = br#"{"messages":[{"role":"user","content":5}]}"#;
    assert!(matches!(
        error_of(Chat, bad_content),
        ParseError::WrongType { .. }
    ));
    let bad_model = br#"{"model":1,"messages":[{"role":"user","content":"x"}]}"#;
    assert!(matches!(
        error_of(Chat, bad_model),
        ParseError::WrongType { .. }
    ));
    assert!(matches!(
        error_of(Completions, b"{}"),
        ParseError::Missing("prompt")
    ));
    assert!(matches!(
        error_of(Completions, br#"{"prompt":""}"#),
        ParseError::Empty(_)
    ));
    let bad_ids = br#"{"prompt":[1,"x"]}"#;
    assert!(matches!(
        error_of(Completions, bad_ids),
        ParseError::WrongType { .. }
    ));
    assert!(matches!(
        error_of(Responses, b"{}"),
        ParseError::Missing("input")
    ));
    assert!(matches!(
        error_of(Responses, br#"{"input":[]}"#),
        ParseError::Empty(_)
    ));
}

#[test]
fn deep_nesting_is_refused_without_overflow() {
    for prefix in [
        r#"{"messages":[{"role":"user","content":"#,
        r#"{"messages":[{"role":"user","content":"x"}],"extra":"#,
    ] {
        let mut body = String::from(prefix);
        body.push_str(&"[".repeat(100_000));
        body.push_str(&"]".repeat(100_000));
        body.push_str("}]}");
        let error = error_of(Endpoint::Chat, body.as_bytes());
        let refused = matches!(
            error,
            ParseError::TooDeep { .. } | ParseError::Syntax { .. }
        );
        assert!(refused, "{error}");
    }
}

#[test]
fn unknown_fields_are_ignored() {
    let body =
        br#"{"messages":[{"role":"user","content":"x","weird":{"a":[1]}}],"temperature":0.2}"#;
    assert!(parse(Endpoint::Chat, body).is_ok());
}

#[test]
fn long_parts_borrow_the_body() {
    let long = "y".repeat(10_000);
    let body = serde_json::to_vec(&json!({"messages": [
        {"role": "system", "content": long}, {"role": "user", "content": long}]}))
    .unwrap();
    let parsed = parse(Endpoint::Chat, &body).unwrap();
    let range = body.as_ptr_range();
    let big: Vec<&[u8]> = parsed
        .text
        .parts()
        .iter()
        .map(|p| p.as_ref())
        .filter(|p| p.len() >= 10_000)
        .collect();
    assert_eq!(big.len(), 2);
    assert!(big.iter().all(|p| range.contains(&p.as_ptr())));
}

#[test]
fn paths_name_endpoints() {
    assert_eq!(
        Endpoint::from_path("/v1/chat/completions?x=1"),
        Some(Endpoint::Chat)
    );
    assert_eq!(
        Endpoint::from_path("/v1/messages?beta=true"),
        Some(Endpoint::Messages)
    );
    assert_eq!(
        Endpoint::from_path("/v1/messages/count_tokens"),
        Some(Endpoint::CountTokens)
    );
    assert_eq!(Endpoint::from_path("/v1/models"), None);
}

// ---- turn N+1 extends turn N, for random conversations ----

fn any_text() -> impl Strategy<Value = String> {
    prop::string::string_regex("[a-z \"\\\\\n\u{e9}\u{4e2d}]{0,40}").unwrap()
}

fn any_message() -> impl Strategy<Value = Value> {
    let plain = (
        prop::sample::select(vec!["system", "user", "assistant", "tool"]),
        any_text(),
    )
        .prop_map(|(role, text)| json!({"role": role, "content": text}));
    let parts = prop::collection::vec(any_text(), 1..3).prop_map(|texts| {
        let parts: Vec<Value> = texts
            .iter()
            .map(|t| json!({"type": "text", "text": t}))
            .collect();
        json!({"role": "user", "content": parts})
    });
    let call = (any_text(), any_text()).prop_map(|(name, args)| {
        json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": "x", "type": "function", "function": {"name": name, "arguments": args}}]})
    });
    prop_oneof![plain, parts, call]
}

fn any_item() -> impl Strategy<Value = Value> {
    let message = (prop::sample::select(vec!["user", "assistant"]), any_text())
        .prop_map(|(role, text)| json!({"role": role, "content": text}));
    let call = (any_text(), any_text()).prop_map(
        |(n, a)| json!({"type": "function_call", "call_id": "c", "name": n, "arguments": a}),
    );
    let output = any_text()
        .prop_map(|o| json!({"type": "function_call_output", "call_id": "c", "output": o}));
    prop_oneof![message, call, output]
}

fn any_anthropic_message() -> impl Strategy<Value = Value> {
    let plain = (prop::sample::select(vec!["user", "assistant"]), any_text())
        .prop_map(|(role, text)| json!({"role": role, "content": text}));
    let blocks = (any_text(), any_text()).prop_map(|(a, b)| {
        json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t", "content": a},
            {"type": "text", "text": b}]})
    });
    let call = (any_text(), any_text()).prop_map(|(text, name)| {
        json!({"role": "assistant", "content": [{"type": "text", "text": text},
            {"type": "tool_use", "id": "t", "name": name, "input": {"q": text}}]})
    });
    prop_oneof![plain, blocks, call]
}

fn assert_extends(texts: &[Vec<u8>]) {
    for pair in texts.windows(2) {
        assert!(
            pair[1].starts_with(&pair[0]),
            "turn text does not extend the previous turn"
        );
    }
}

proptest! {
    #[test]
    fn chat_turns_extend(messages in prop::collection::vec(any_message(), 1..8), tools in any::<bool>()) {
        let texts: Vec<Vec<u8>> = (1..=messages.len()).map(|n| {
            let mut body = json!({"model": "m", "messages": messages[..n]});
            if tools { body["tools"] = json!([{"type": "function", "function": {"name": "f"}}]); }
            text_of(Endpoint::Chat, &body)
        }).collect();
        assert_extends(&texts);
    }

    #[test]
    fn completions_turns_extend(chunks in prop::collection::vec(any_text(), 1..6),
                                ids in prop::collection::vec(0u32..200_000, 1..40)) {
        let mut prompt = String::new();
        let texts: Vec<Vec<u8>> = chunks.iter().filter_map(|c| {
            prompt.push_str(c);
            (!prompt.is_empty()).then(|| text_of(Endpoint::Completions, &json!({"prompt": prompt})))
        }).collect();
        assert_extends(&texts);
        let texts: Vec<Vec<u8>> = (1..=ids.len())
            .map(|n| text_of(Endpoint::Completions, &json!({"prompt": ids[..n]})))
            .collect();
        assert_extends(&texts);
    }

    #[test]
    fn responses_turns_extend(items in prop::collection::vec(any_item(), 1..8)) {
        let texts: Vec<Vec<u8>> = (1..=items.len())
            .map(|n| text_of(Endpoint::Responses, &json!({"instructions": "I", "input": items[..n]})))
            .collect();
        assert_extends(&texts);
    }

    #[test]
    fn messages_turns_extend(messages in prop::collection::vec(any_anthropic_message(), 1..8)) {
        let texts: Vec<Vec<u8>> = (1..=messages.len())
            .map(|n| text_of(Endpoint::Messages, &json!({"system": "S", "messages": messages[..n]})))
            .collect();
        assert_extends(&texts);
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        for endpoint in [Endpoint::Chat, Endpoint::Completions, Endpoint::Responses, Endpoint::Messages] {
            let _ = parse(endpoint, &bytes);
        }
    }
}

// ---- fuzzing: arbitrary JSON where routing reads, and damaged valid bodies ----

fn any_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u32>().prop_map(Value::from),
        "[a-z\"\\\\\n\u{e9}]{0,8}".prop_map(Value::String),
        prop::sample::select(vec![
            "user",
            "assistant",
            "text",
            "image_url",
            "function_call",
            "message"
        ])
        .prop_map(|s| Value::String(s.into())),
    ];
    leaf.prop_recursive(4, 48, 5, |inner| {
        let keys = prop::sample::select(vec![
            "role",
            "content",
            "type",
            "text",
            "tool_calls",
            "function",
            "name",
            "arguments",
            "image_url",
            "output",
            "summary",
            "id",
            "session_id",
            "user_id",
            "tool_use",
            "tool_result",
            "input",
            "source",
            "x",
        ]);
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(keys, inner, 0..5).prop_map(|m| Value::Object(
                m.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
            )),
        ]
    })
}

proptest! {
    #[test]
    fn arbitrary_json_where_routing_reads_never_panics(
        conversation in any_value(),
        model in any_value(),
        tools in any_value(),
        session in any_value(),
    ) {
        for (endpoint, key) in [(Endpoint::Chat, "messages"), (Endpoint::Completions, "prompt"), (Endpoint::Responses, "input"), (Endpoint::Messages, "messages")] {
            let body = json!({ key: conversation, "model": model, "tools": tools, "session_params": session, "instructions": model, "system": tools, "metadata": session, "prompt_cache_key": model });
            let bytes = serde_json::to_vec(&body).unwrap();
            if let Ok(parsed) = parse(endpoint, &bytes) {
                prop_assert_eq!(parsed.text.to_vec().len(), parsed.text.len());
            }
        }
    }

    #[test]
    fn damaged_valid_bodies_never_panic(messages in prop::collection::vec(any_message(), 1..5), at in any::<prop::sample::Index>(), byte in any::<u8>()) {
        let mut bytes = serde_json::to_vec(&json!({"messages": messages})).unwrap();
        let i = at.index(bytes.len());
        bytes[i] = byte;
        let _ = parse(Endpoint::Chat, &bytes);
        bytes.truncate(i);
        prop_assert!(parse(Endpoint::Chat, &bytes).is_err());
    }
}
