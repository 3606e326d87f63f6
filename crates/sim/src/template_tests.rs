//! Unit tests of the simulator's template (a child module of `template`).

use serde_json::json;

use super::*;

fn strip_generation_prompt(rendered: &[u8]) -> &[u8] {
    rendered
        .strip_suffix(GENERATION_PROMPT.as_bytes())
        .expect("ends with the generation prompt")
}

fn assert_prefix(turn: &[u8], next: &[u8]) {
    let base = strip_generation_prompt(turn);
    assert!(
        next.starts_with(base),
        "{:?}\nis not a prefix of\n{:?}",
        String::from_utf8_lossy(base),
        String::from_utf8_lossy(next)
    );
    assert!(next.len() > turn.len());
}

#[test]
fn chat_is_prefix_stable_across_turns() {
    let tools = json!([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]);
    let mut messages = vec![
        json!({"role": "system", "content": "You are terse."}),
        json!({"role": "user", "content": [{"type": "text", "text": "Weather?"}, {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}),
    ];
    let turn1 = render_chat(&json!({"tools": tools, "messages": messages}), true).unwrap();
    messages.push(json!({"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]}));
    messages.push(json!({"role": "tool", "tool_call_id": "c1", "content": "sunny"}));
    let turn2 = render_chat(&json!({"tools": tools, "messages": messages}), true).unwrap();
    assert_prefix(&turn1, &turn2);
    messages.push(json!({"role": "assistant", "content": "Sunny."}));
    messages.push(json!({"role": "user", "content": "Thanks"}));
    let turn3 = render_chat(&json!({"tools": tools, "messages": messages}), true).unwrap();
    assert_prefix(&turn2, &turn3);
    let text = String::from_utf8(turn1).unwrap();
    assert!(text.starts_with("<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>tools\n"));
    assert!(text.contains("Weather?\n<image:"));
}

#[test]
fn chat_without_generation_prompt_is_the_stripped_rendering() {
    let body = json!({"messages": [{"role": "user", "content": "hi"}]});
    let with = render_chat(&body, true).unwrap();
    let without = render_chat(&body, false).unwrap();
    assert_eq!(strip_generation_prompt(&with), &without[..]);
    assert_eq!(
        String::from_utf8(with).unwrap(),
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    );
}

#[test]
fn completions_are_prefix_stable() {
    let a = render_completion(&json!("The quick brown fox"), 4).unwrap();
    let b = render_completion(&json!("The quick brown fox jumps"), 4).unwrap();
    assert!(b.starts_with(&a));
    let ids = render_completion(&json!([1, 2, 3]), 4).unwrap();
    let more = render_completion(&json!([1, 2, 3, 4, 5]), 4).unwrap();
    assert!(more.starts_with(&ids));
    // One token per id.
    assert_eq!(token_count(&ids, 4), 3);
    assert_eq!(
        token_count(&render_completion(&json!([[7, 8]]), 3).unwrap(), 3),
        2
    );
    let joined = render_completion(&json!(["ab", "cd"]), 4).unwrap();
    assert_eq!(joined, b"abcd");
}

#[test]
fn responses_are_prefix_stable() {
    let mut input =
        vec![json!({"role": "user", "content": [{"type": "input_text", "text": "Plan a trip"}]})];
    let body = |input: &Vec<Value>| json!({"instructions": "Be brief.", "input": input});
    let turn1 = render_responses(&body(&input)).unwrap();
    input.push(json!({"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "think"}]}));
    input.push(json!({"type": "function_call", "call_id": "c1", "name": "search", "arguments": "{\"q\":\"x\"}"}));
    input.push(json!({"type": "function_call_output", "call_id": "c1", "output": "results"}));
    let turn2 = render_responses(&body(&input)).unwrap();
    assert_prefix(&turn1, &turn2);
    input.push(json!({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Go to Rome."}]}));
    input.push(json!({"role": "user", "content": "And then?"}));
    let turn3 = render_responses(&body(&input)).unwrap();
    assert_prefix(&turn2, &turn3);
    assert!(
        String::from_utf8(turn1)
            .unwrap()
            .starts_with("<|im_start|>system\nBe brief.<|im_end|>\n")
    );
}

#[test]
fn string_input_equals_single_user_message() {
    let a = render_responses(&json!({"input": "hello"})).unwrap();
    let b = render_responses(&json!({"input": [{"role": "user", "content": "hello"}]})).unwrap();
    assert_eq!(a, b);
}

#[test]
fn media_markers_depend_on_data() {
    let part = |url: &str| json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}]});
    let a = render_chat(&part("data:a"), true).unwrap();
    let b = render_chat(&part("data:b"), true).unwrap();
    assert_ne!(a, b);
    assert_eq!(a, render_chat(&part("data:a"), true).unwrap());
    assert!(a.len() < 80);
}

#[test]
fn output_tokens_and_stream() {
    let parsed = parse(
        GenerationEndpoint::Chat,
        &json!({"messages": [{"role": "user", "content": "x"}]}),
        4,
    )
    .unwrap();
    assert_eq!(parsed.output_tokens, DEFAULT_OUTPUT_TOKENS);
    assert!(!parsed.stream);
    let body = json!({"prompt": "x", "max_tokens": 5, "max_completion_tokens": 7, "stream": true});
    let parsed = parse(GenerationEndpoint::Completions, &body, 4).unwrap();
    assert_eq!(parsed.output_tokens, 7);
    assert!(parsed.stream);
    assert_eq!(output_tokens(&json!({"max_output_tokens": 3})).unwrap(), 3);
    assert!(output_tokens(&json!({"max_tokens": 0})).is_err());
    assert!(output_tokens(&json!({"max_tokens": "5"})).is_err());
}

#[test]
fn bad_requests_are_rejected() {
    for (endpoint, body) in [
        (GenerationEndpoint::Chat, json!({})),
        (GenerationEndpoint::Chat, json!({"messages": []})),
        (
            GenerationEndpoint::Chat,
            json!({"messages": [{"content": "no role"}]}),
        ),
        (
            GenerationEndpoint::Chat,
            json!({"messages": [{"role": "user", "content": 5}]}),
        ),
        (
            GenerationEndpoint::Chat,
            json!({"messages": [{"role": "user", "content": [{"text": "no type"}]}]}),
        ),
        (GenerationEndpoint::Completions, json!({"prompt": {"a": 1}})),
        (GenerationEndpoint::Completions, json!({"prompt": [-1]})),
        (GenerationEndpoint::Responses, json!({"input": 3})),
        (GenerationEndpoint::Chat, json!([1, 2])),
        (
            GenerationEndpoint::Chat,
            json!({"messages": [{"role": "user", "content": "x"}], "stream": "yes"}),
        ),
    ] {
        let err = parse(endpoint, &body, 4).unwrap_err();
        assert_eq!(err.status(), hyper::StatusCode::BAD_REQUEST, "{body}");
    }
}

#[test]
fn token_ids_are_deterministic_and_prefix_stable() {
    let a = token_ids(b"hello world!", 4);
    let b = token_ids(b"hello world! more", 4);
    assert_eq!(a.len(), 3);
    assert_eq!(&b[..3], &a[..]);
    assert!(a.iter().all(|&id| u64::from(id) < VOCAB));
    let tokenize =
        render_tokenize(&json!({"messages": [{"role": "user", "content": "hi"}]}), 4).unwrap();
    assert_eq!(
        tokenize,
        render_chat(
            &json!({"messages": [{"role": "user", "content": "hi"}]}),
            true
        )
        .unwrap()
    );
    let no_gen =
        json!({"messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": false});
    assert_eq!(
        render_tokenize(&no_gen, 4).unwrap(),
        render_chat(&no_gen, false).unwrap()
    );
}

#[test]
fn a_messages_body_renders_as_the_chat_vllm_makes_of_it() {
    let messages = json!({"model": "m", "max_tokens": 4,
        "system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=1; cch=9;"},
                   {"type": "text", "text": "SYS"}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "U1"}]},
            {"role": "system", "content": "S2"},
            {"role": "assistant", "content": "A1"},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": "R"},
                {"type": "text", "text": "U2"}]}]});
    let chat = json!({"messages": [
        {"role": "system", "content": "SYS"},
        {"role": "user", "content": "U1"},
        {"role": "system", "content": "S2"},
        {"role": "assistant", "content": "A1"},
        {"role": "tool", "tool_call_id": "t1", "content": "R"},
        {"role": "user", "content": "U2"}]});
    let rendered = parse(GenerationEndpoint::Messages, &messages, 4)
        .unwrap()
        .prompt;
    assert_eq!(
        String::from_utf8(rendered).unwrap(),
        String::from_utf8(render_chat(&chat, true).unwrap()).unwrap()
    );
}

/// Tools go after the leading system turn, where Qwen's and Llama's templates render them,
/// and first without one; the same on every endpoint.
#[test]
fn tools_follow_the_system_prompt_on_every_endpoint() {
    let tools = json!([{"type": "function", "name": "f"}]);
    let chat = |messages: Value| {
        let body = json!({"tools": tools, "messages": messages});
        String::from_utf8(render_chat(&body, true).unwrap()).unwrap()
    };
    let with_system = chat(json!([{"role": "system", "content": "SYS"},
        {"role": "user", "content": "U"}]));
    let order = ["SYS", "<|im_start|>tools", "U<|im_end|>"].map(|m| with_system.find(m).unwrap());
    assert!(order.windows(2).all(|w| w[0] < w[1]), "{with_system}");
    let without = chat(json!([{"role": "user", "content": "U"}]));
    assert!(without.starts_with("<|im_start|>tools\n"), "{without}");
    let responses = |body: Value| String::from_utf8(render_responses(&body).unwrap()).unwrap();
    let instructions = responses(json!({"tools": tools, "instructions": "SYS", "input": "U"}));
    assert_eq!(instructions, with_system);
    let system_item = responses(json!({"tools": tools,
        "input": [{"role": "system", "content": "SYS"}, {"role": "user", "content": "U"}]}));
    assert_eq!(system_item, with_system);
    let messages = json!({"tools": tools, "system": "SYS", "max_tokens": 4,
        "messages": [{"role": "user", "content": "U"}]});
    let rendered = parse(GenerationEndpoint::Messages, &messages, 4)
        .unwrap()
        .prompt;
    assert_eq!(String::from_utf8(rendered).unwrap(), with_system);
}
