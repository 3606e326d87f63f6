//! `/v1/completions` bodies: the `prompt`, as a string, an array of strings, an array of
//! token ids, or an array of such arrays. Token ids are routed on as their digits, with the
//! closing bracket left off so that a longer prompt extends a shorter one.

use serde::Deserialize;
use serde::de::{SeqAccess, Visitor};
use serde_json::value::RawValue;

use super::ParseError;
use super::raw::{self, Kind};
use super::text::RoutingText;

const PROMPT: &str = "prompt";
const PROMPT_SHAPE: &str = "a string, an array of strings or an array of token ids";

/// Appends the prompt of a completions body.
pub fn build<'a>(
    text: &mut RoutingText<'a>,
    prompt: Option<&'a RawValue>,
) -> Result<(), ParseError> {
    let prompt = prompt.ok_or(ParseError::Missing(PROMPT))?;
    match raw::kind(prompt) {
        Kind::String => text.push(raw::string(prompt, PROMPT)?),
        Kind::Array => push_array(text, prompt)?,
        _ => return Err(wrong_shape()),
    }
    if text.is_empty() {
        return Err(ParseError::Empty(PROMPT));
    }
    text.mark_anchor();
    Ok(())
}

fn push_array<'a>(text: &mut RoutingText<'a>, prompt: &'a RawValue) -> Result<(), ParseError> {
    let bytes = prompt.get().as_bytes();
    let first = bytes[1..].iter().find(|b| !b.is_ascii_whitespace());
    match first {
        Some(b'"') | Some(b'[') => {
            let items: Vec<&'a RawValue> = serde_json::from_str(prompt.get())?;
            items.iter().try_for_each(|item| push_item(text, item))
        }
        Some(b']') | None => Ok(()),
        Some(_) => push_token_ids(text, prompt),
    }
}

fn push_item<'a>(text: &mut RoutingText<'a>, item: &'a RawValue) -> Result<(), ParseError> {
    match raw::kind(item) {
        Kind::String => text.push(raw::string(item, PROMPT)?),
        Kind::Array => push_token_ids(text, item)?,
        _ => return Err(wrong_shape()),
    }
    text.push(b"\n<|prompt|>\n");
    Ok(())
}

fn push_token_ids<'a>(text: &mut RoutingText<'a>, ids: &'a RawValue) -> Result<(), ParseError> {
    serde_json::from_str::<TokenIds>(ids.get()).map_err(|_| wrong_shape())?;
    text.push(raw::open_array(ids));
    Ok(())
}

fn wrong_shape() -> ParseError {
    ParseError::WrongType {
        field: PROMPT,
        expected: PROMPT_SHAPE,
    }
}

/// Checks that an array holds only non-negative integers, without allocating.
struct TokenIds;

impl<'de> Deserialize<'de> for TokenIds {
    fn deserialize<D: serde::Deserializer<'de>>(de: D) -> Result<Self, D::Error> {
        de.deserialize_seq(TokenIds)
    }
}

impl<'de> Visitor<'de> for TokenIds {
    type Value = TokenIds;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("an array of token ids")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<TokenIds, A::Error> {
        while seq.next_element::<u32>()?.is_some() {}
        Ok(TokenIds)
    }
}
