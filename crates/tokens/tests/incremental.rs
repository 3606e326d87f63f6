//! Tokenizing through the segment cache equals tokenizing the whole render, turn after turn, for the real
//! Qwen3 and Llama 3.1 tokenizers (fetched by `tests/tokens/fetch.sh target/tokenizers`,
//! which `make test` runs first; `PREFIX_ROUTER_TOKENIZERS` names another directory).

mod common;

use prefix_router_core::request::Endpoint;
use prefix_router_tokens::encode::chain_of_ids;
use prefix_router_tokens::{Model, TokenCache};
use proptest::prelude::*;
use serde_json::{Value, json};

/// The model called `name`, loaded once.
fn model(name: &'static str) -> &'static Model {
    static MODELS: std::sync::Mutex<Vec<(&str, &Model)>> = std::sync::Mutex::new(Vec::new());
    let mut models = MODELS.lock().unwrap();
    if let Some((_, m)) = models.iter().find(|(n, _)| *n == name) {
        return m;
    }
    let model: &'static Model = Box::leak(Box::new(common::load(name)));
    models.push((name, model));
    model
}

fn word() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z]{1,8}",
        Just("é日本🎉".to_string()),
        Just("\n".to_string()),
        Just("<think>\nhmm\n</think>\n\n".to_string()),
        Just(String::new()),
    ]
}

fn turn() -> impl Strategy<Value = (String, String)> {
    (
        prop::collection::vec(word(), 0..30).prop_map(|w| w.join(" ")),
        prop::collection::vec(word(), 0..30).prop_map(|w| w.join(" ")),
    )
}

/// Every turn of a conversation, the incremental chain equals the whole render's.
fn check(model: &Model, system: &str, turns: &[(String, String)]) -> Result<(), TestCaseError> {
    let cache = TokenCache::new(64 << 20);
    let mut messages = vec![json!({"role": "system", "content": system})];
    for (question, answer) in turns {
        messages.push(json!({"role": "user", "content": question}));
        let body = json!({"model": "m", "messages": Value::from(messages.clone())});
        let bytes = serde_json::to_vec(&body).unwrap();
        let prompt = model.renderer().prompt(Endpoint::Chat, &bytes).unwrap();
        let incremental = model.encode(&prompt, &cache).unwrap();
        let whole = chain_of_ids(&model.ids(&prompt).unwrap());
        prop_assert_eq!(&incremental.chain, &whole.chain);
        prop_assert_eq!(incremental.tokens, whole.tokens);
        messages.push(json!({"role": "assistant", "content": answer}));
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn incremental_equals_whole_for_qwen3(system in "[a-z ]{0,40}", turns in prop::collection::vec(turn(), 1..6)) {
        check(model("qwen3"), &system, &turns)?;
    }

    #[test]
    fn incremental_equals_whole_for_llama3_1(system in "[a-z ]{0,40}", turns in prop::collection::vec(turn(), 1..6)) {
        check(model("llama3_1"), &system, &turns)?;
    }
}

#[test]
fn the_next_turn_reuses_the_previous_render() {
    let model = model("qwen3");
    let cache = TokenCache::new(64 << 20);
    let long = "a conversation about code ".repeat(400);
    let mut messages = vec![json!({"role": "user", "content": long})];
    let encode = |messages: &[Value]| {
        let bytes = serde_json::to_vec(&json!({"model": "m", "messages": messages})).unwrap();
        let prompt = model.renderer().prompt(Endpoint::Chat, &bytes).unwrap();
        model.encode(&prompt, &cache).unwrap()
    };
    let first = encode(&messages);
    assert_eq!(first.reused, 0);
    messages.push(json!({"role": "assistant", "content": "done"}));
    messages.push(json!({"role": "user", "content": "and now?"}));
    let next = encode(&messages);
    assert!(
        next.reused > first.tokens / 2,
        "{next:?} after {}",
        first.tokens
    );
    assert!(cache.bytes() > 0 && !cache.is_empty());
    // Another conversation opening with the same long message reuses it too.
    let other = encode(&[
        json!({"role": "user", "content": long}),
        json!({"role": "assistant", "content": "?"}),
        json!({"role": "user", "content": "other"}),
    ]);
    assert!(other.reused > first.tokens / 2, "{other:?}");
}

/// Text of every kind the tokenizers split on: words, digits, spaces and newlines of all
/// runs, punctuation, contractions, non-ASCII, and the models' added tokens.
fn raw_text() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        "[a-zA-Z]{1,12}",
        "[0-9]{1,7}",
        "[ \t\n\r]{1,4}",
        "[!-/:-@\\[-`{-~]{1,5}",
        Just("'s don't I'LL".to_string()),
        Just("é日本🎉 naïve e\u{301}".to_string()),
        Just("<|im_start|>user\n".to_string()),
        Just("<|eot_id|><|start_header_id|>".to_string()),
        Just("<think>".to_string()),
    ];
    prop::collection::vec(piece, 0..60).prop_map(|p| p.concat())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn the_shortcut_gives_the_tokenizers_own_ids(text in raw_text()) {
        for name in ["qwen3", "llama3_1"] {
            let model = model(name);
            let prompt = prefix_router_tokens::Prompt::Text { text: text.clone(), special: false };
            prop_assert_eq!(model.ids(&prompt).unwrap(), model.reference_ids(&text).unwrap(), "{}", name);
        }
    }
}
