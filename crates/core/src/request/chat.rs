//! `/v1/chat/completions` messages: every message in order (role marker, content, assistant
//! tool calls and legacy function call), as a chat template renders them.

use super::ParseError;
use super::content::{arguments, push_call, push_content, string};
use super::json::{Json, Kind};
use super::text::{Mark, RoutingText};

/// Appends every message of a `messages` array; returns how many there were. A first
/// message of role `system` is the system prompt, marked as such.
pub fn push_messages<'a>(
    j: &mut Json<'a>,
    text: &mut RoutingText<'a>,
) -> Result<usize, ParseError> {
    if j.kind() != Kind::Array {
        return Err(ParseError::WrongType {
            field: "messages",
            expected: "an array",
        });
    }
    let mut count = 0;
    j.array(|j| {
        count += 1;
        if push_message(j, text)? == b"system" && count == 1 {
            text.mark_system_end();
        }
        Ok(())
    })?;
    Ok(count)
}

/// Appends one message; returns its role.
fn push_message<'a>(j: &mut Json<'a>, text: &mut RoutingText<'a>) -> Result<&'a [u8], ParseError> {
    if j.kind() != Kind::Object {
        return Err(ParseError::WrongType {
            field: "messages[]",
            expected: "an object",
        });
    }
    let mut role = RoleMarker::new(text);
    j.object(|j, key| match key {
        b"role" => role.set(text, string(j, "messages[].role")?),
        b"content" => push_content(j, text, "messages[].content"),
        b"tool_calls" => push_tool_calls(j, text),
        b"function_call" => push_function(j, text),
        _ => j.skip(),
    })?;
    let role = role
        .finish(text)
        .ok_or(ParseError::Missing("messages[].role"))?;
    if role == b"user" {
        text.mark_anchor();
    }
    Ok(role)
}

/// A message's role marker goes before its content. It is written as soon as the role is
/// read, which is first in nearly every body; a role that comes after the content is
/// inserted in front of it at the end.
struct RoleMarker<'a> {
    start: Mark,
    role: Option<&'a [u8]>,
    written: bool,
}

impl<'a> RoleMarker<'a> {
    fn new(text: &RoutingText<'a>) -> Self {
        RoleMarker {
            start: text.mark(),
            role: None,
            written: false,
        }
    }

    fn set(&mut self, text: &mut RoutingText<'a>, role: &'a [u8]) -> Result<(), ParseError> {
        if self.role.replace(role).is_some() {
            return Err(ParseError::Duplicate("messages[].role"));
        }
        if text.mark() == self.start {
            text.insert(self.start, &[b"\n<|", role, b"|>\n"]);
            self.written = true;
        }
        Ok(())
    }

    fn finish(self, text: &mut RoutingText<'a>) -> Option<&'a [u8]> {
        let role = self.role?;
        if !self.written {
            text.insert(self.start, &[b"\n<|", role, b"|>\n"]);
        }
        Some(role)
    }
}

fn push_tool_calls<'a>(j: &mut Json<'a>, text: &mut RoutingText<'a>) -> Result<(), ParseError> {
    match j.kind() {
        Kind::Null => j.null(),
        Kind::Array => j.array(|j| {
            j.object(|j, key| match key {
                b"function" => push_function(j, text),
                _ => j.skip(),
            })
        }),
        _ => Err(ParseError::WrongType {
            field: "tool_calls",
            expected: "an array",
        }),
    }
}

fn push_function<'a>(j: &mut Json<'a>, text: &mut RoutingText<'a>) -> Result<(), ParseError> {
    if j.kind() == Kind::Null {
        return j.null();
    }
    let (mut name, mut args) = (None, None);
    j.object(|j, key| {
        match key {
            b"name" => name = Some(string(j, "function.name")?),
            b"arguments" => args = Some(arguments(j)?),
            _ => j.skip()?,
        }
        Ok(())
    })?;
    push_call(text, name, args);
    Ok(())
}
