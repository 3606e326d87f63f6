//! `/v1/completions` prompts: a string, an array of strings, an array of token ids, or an
//! array of such arrays. Token ids are routed on as their digits, with the closing bracket
//! left off so that a longer prompt extends a shorter one.

use super::ParseError;
use super::json::{Json, Kind};
use super::text::RoutingText;

const PROMPT: &str = "prompt";

fn wrong_shape() -> ParseError {
    ParseError::WrongType {
        field: PROMPT,
        expected: "a string, an array of strings or an array of token ids",
    }
}

/// Appends a prompt.
pub fn push_prompt<'a>(j: &mut Json<'a>, text: &mut RoutingText<'a>) -> Result<(), ParseError> {
    match j.kind() {
        Kind::String => text.push(j.string()?),
        Kind::Array => push_array(j, text)?,
        _ => return Err(wrong_shape()),
    }
    if text.is_empty() {
        return Err(ParseError::Empty(PROMPT));
    }
    // No anchor: a prompt names no turns, and the whole of it names its conversation.
    Ok(())
}

fn push_array<'a>(j: &mut Json<'a>, text: &mut RoutingText<'a>) -> Result<(), ParseError> {
    let raw = j.raw()?;
    let (mut ids, mut prompts) = (0, 0);
    Json::new(raw).array(|item| {
        match item.kind() {
            Kind::String => text.push(item.string()?),
            Kind::Array => text.push(open(check_token_ids(item)?)),
            _ => {
                ids += 1;
                return token_id(item);
            }
        }
        prompts += 1;
        text.push(b"\n<|prompt|>\n");
        Ok(())
    })?;
    match (ids, prompts) {
        (0, _) => Ok(()),
        (_, 0) => {
            text.push(open(raw));
            Ok(())
        }
        _ => Err(wrong_shape()),
    }
}

/// An array's bytes without its closing bracket, so that an array extended at its end
/// starts with the bytes of the shorter one (`[1,2` is a prefix of `[1,2,3`).
fn open(array: &[u8]) -> &[u8] {
    &array[..array.len().saturating_sub(1)]
}

/// Reads an array of token ids; returns its bytes.
fn check_token_ids<'a>(j: &mut Json<'a>) -> Result<&'a [u8], ParseError> {
    let raw = j.raw()?;
    Json::new(raw).array(token_id).map_err(|_| wrong_shape())?;
    Ok(raw)
}

fn token_id(j: &mut Json<'_>) -> Result<(), ParseError> {
    let digits = j.number().map_err(|_| wrong_shape())?;
    let value = std::str::from_utf8(digits)
        .ok()
        .and_then(|d| d.parse::<u32>().ok());
    value.map(drop).ok_or_else(wrong_shape)
}
