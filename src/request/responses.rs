//! `/v1/responses` bodies: tools first, then `instructions`, then `input` (a string, or a
//! list of items: messages, function calls, function call outputs, reasoning summaries).

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;

use super::ParseError;
use super::content::{push_call, push_content, push_role, push_tools};
use super::raw::{self, Kind};
use super::text::RoutingText;

/// One item of an `input` list, as far as routing reads it.
#[derive(Deserialize)]
struct Item<'a> {
    #[serde(borrow, rename = "type")]
    kind: Option<Cow<'a, str>>,
    #[serde(borrow)]
    role: Option<&'a RawValue>,
    #[serde(borrow)]
    content: Option<&'a RawValue>,
    #[serde(borrow)]
    name: Option<&'a RawValue>,
    #[serde(borrow)]
    arguments: Option<&'a RawValue>,
    #[serde(borrow)]
    output: Option<&'a RawValue>,
    #[serde(borrow)]
    summary: Option<&'a RawValue>,
    #[serde(borrow)]
    id: Option<&'a RawValue>,
}

/// Appends tools, instructions and input of a responses body.
pub fn build<'a>(
    text: &mut RoutingText<'a>,
    tools: Option<&'a RawValue>,
    instructions: Option<&'a RawValue>,
    input: Option<&'a RawValue>,
) -> Result<(), ParseError> {
    let input = input.ok_or(ParseError::Missing("input"))?;
    push_tools(text, tools);
    if let Some(instructions) = raw::opt_string(instructions, "instructions")? {
        push_role(text, b"instructions");
        text.push(instructions);
    }
    match raw::kind(input) {
        Kind::String => push_user_string(text, input)?,
        Kind::Array => push_items(text, input)?,
        _ => {
            return Err(ParseError::WrongType {
                field: "input",
                expected: "a string or an array of items",
            });
        }
    }
    Ok(())
}

fn push_user_string<'a>(text: &mut RoutingText<'a>, input: &'a RawValue) -> Result<(), ParseError> {
    let body = raw::string(input, "input")?;
    if body.is_empty() {
        return Err(ParseError::Empty("input"));
    }
    push_role(text, b"user");
    text.push(body);
    text.mark_anchor();
    Ok(())
}

fn push_items<'a>(text: &mut RoutingText<'a>, input: &'a RawValue) -> Result<(), ParseError> {
    let items: Vec<Item<'a>> = serde_json::from_str(input.get())?;
    if items.is_empty() {
        return Err(ParseError::Empty("input"));
    }
    items.iter().try_for_each(|item| push_item(text, item))
}

fn push_item<'a>(text: &mut RoutingText<'a>, item: &Item<'a>) -> Result<(), ParseError> {
    match item.kind.as_deref() {
        None | Some("message") => push_message(text, item)?,
        Some("function_call") => {
            let name = raw::opt_string(item.name, "input[].name")?;
            let args = raw::opt_string(item.arguments, "input[].arguments")?;
            push_call(text, name, args);
        }
        Some("function_call_output") => {
            push_role(text, b"tool");
            push_content(text, item.output, "input[].output")?;
        }
        Some("reasoning") => {
            push_role(text, b"reasoning");
            push_content(text, item.summary, "input[].summary")?;
        }
        Some(other) => {
            let id = item.id.map_or(other.as_bytes(), |id| id.get().as_bytes());
            text.push_digest(b"<item:", id);
        }
    }
    Ok(())
}

fn push_message<'a>(text: &mut RoutingText<'a>, item: &Item<'a>) -> Result<(), ParseError> {
    let role_raw = item.role.ok_or(ParseError::Missing("input[].role"))?;
    let role = raw::string(role_raw, "input[].role")?;
    push_role(text, role);
    push_content(text, item.content, "input[].content")?;
    if role == b"user" {
        text.mark_anchor();
    }
    Ok(())
}
