//! `/v1/responses` input: a string, or a list of items (messages, function calls, function
//! call outputs, reasoning summaries). A first item of role `system` is the system prompt,
//! marked as such; the caller places `instructions` and tools.

use super::ParseError;
use super::content::{arguments, insert_role, push_call, push_content, string};
use super::json::{Json, Kind};
use super::text::RoutingText;

/// Appends an `input` value.
pub fn push_input<'a>(j: &mut Json<'a>, text: &mut RoutingText<'a>) -> Result<(), ParseError> {
    match j.kind() {
        Kind::String => {
            let start = text.mark();
            let body = j.string()?;
            if body.is_empty() {
                return Err(ParseError::Empty("input"));
            }
            text.push(body);
            insert_role(text, start, b"user");
            text.mark_anchor();
        }
        Kind::Array => {
            let mut count = 0;
            j.array(|j| {
                count += 1;
                if push_item(j, text)? == Some(b"system") && count == 1 {
                    text.mark_system_end();
                }
                Ok(())
            })?;
            if count == 0 {
                return Err(ParseError::Empty("input"));
            }
        }
        _ => {
            return Err(ParseError::WrongType {
                field: "input",
                expected: "a string or an array of items",
            });
        }
    }
    Ok(())
}

/// The fields of an item that decide how it is framed.
#[derive(Default)]
struct Item<'a> {
    kind: Option<&'a [u8]>,
    role: Option<&'a [u8]>,
    name: Option<&'a [u8]>,
    arguments: Option<&'a [u8]>,
    id: Option<&'a [u8]>,
}

/// Appends one item; returns its role, if it has one.
fn push_item<'a>(
    j: &mut Json<'a>,
    text: &mut RoutingText<'a>,
) -> Result<Option<&'a [u8]>, ParseError> {
    if j.kind() != Kind::Object {
        return Err(ParseError::WrongType {
            field: "input[]",
            expected: "an object",
        });
    }
    let start = text.mark();
    let mut item = Item::default();
    j.object(|j, key| {
        match key {
            b"type" => item.kind = Some(string(j, "input[].type")?),
            b"role" => item.role = Some(string(j, "input[].role")?),
            b"name" => item.name = Some(string(j, "input[].name")?),
            b"arguments" => item.arguments = Some(arguments(j)?),
            b"id" => item.id = Some(j.raw()?),
            b"content" | b"output" | b"summary" => push_content(j, text, "input[].content")?,
            _ => j.skip()?,
        }
        Ok(())
    })?;
    frame(text, start, &item)?;
    Ok(item.role)
}

/// Puts the marker an item's type calls for around what it appended.
fn frame<'a>(
    text: &mut RoutingText<'a>,
    start: super::text::Mark,
    item: &Item<'a>,
) -> Result<(), ParseError> {
    match item.kind {
        None | Some(b"message") => {
            let role = item.role.ok_or(ParseError::Missing("input[].role"))?;
            insert_role(text, start, role);
            if role == b"user" {
                text.mark_anchor();
            }
        }
        Some(b"function_call") => push_call(text, item.name, item.arguments),
        Some(b"function_call_output") => insert_role(text, start, b"tool"),
        Some(b"reasoning") => insert_role(text, start, b"reasoning"),
        Some(other) => text.push_digest(b"<item:", item.id.unwrap_or(other)),
    }
    Ok(())
}
