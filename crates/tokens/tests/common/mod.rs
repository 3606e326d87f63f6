//! What the tokens crate's integration tests share: loading a real tokenizer fetched by
//! `tests/tokens/fetch.sh target/tokenizers` (which `make test` runs first;
//! `PREFIX_ROUTER_TOKENIZERS` names another directory).

use std::path::PathBuf;

use prefix_router_tokens::Model;

/// The model called `name` (`qwen3`, `llama3_1`, `llama3_2`); panics when it is missing.
pub fn load(name: &str) -> Model {
    let dir = std::env::var_os("PREFIX_ROUTER_TOKENIZERS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../target/tokenizers"
            ))
        })
        .join(name);
    Model::load(&dir).unwrap_or_else(|e| {
        panic!("{e}: run tests/tokens/fetch.sh target/tokenizers (make test does)")
    })
}
