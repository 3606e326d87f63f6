//! `/v1/chat/completions` bodies: tools first, then every message in order (role marker,
//! content, assistant tool calls), as a chat template would render them.

use serde::Deserialize;
use serde_json::value::RawValue;

use super::ParseError;
use super::content::{push_call, push_content, push_role, push_tools};
use super::raw;
use super::text::RoutingText;

/// One chat message, as far as routing reads it.
#[derive(Deserialize)]
pub struct Message<'a> {
    #[serde(borrow)]
    role: Option<&'a RawValue>,
    #[serde(borrow)]
    content: Option<&'a RawValue>,
    #[serde(borrow)]
    tool_calls: Option<Vec<ToolCall<'a>>>,
    #[serde(borrow)]
    function_call: Option<Function<'a>>,
}

#[derive(Deserialize)]
struct ToolCall<'a> {
    #[serde(borrow)]
    function: Option<Function<'a>>,
}

#[derive(Deserialize)]
struct Function<'a> {
    #[serde(borrow)]
    name: Option<&'a RawValue>,
    #[serde(borrow)]
    arguments: Option<&'a RawValue>,
}

/// Appends tools and every message of a chat body.
pub fn build<'a>(
    text: &mut RoutingText<'a>,
    tools: Option<&'a RawValue>,
    messages: Option<&[Message<'a>]>,
) -> Result<(), ParseError> {
    let messages = messages.ok_or(ParseError::Missing("messages"))?;
    if messages.is_empty() {
        return Err(ParseError::Empty("messages"));
    }
    push_tools(text, tools);
    for message in messages {
        push_message(text, message)?;
    }
    Ok(())
}

fn push_message<'a>(text: &mut RoutingText<'a>, message: &Message<'a>) -> Result<(), ParseError> {
    let role_raw = message.role.ok_or(ParseError::Missing("messages[].role"))?;
    let role = raw::string(role_raw, "messages[].role")?;
    push_role(text, role);
    push_content(text, message.content, "messages[].content")?;
    let calls = message.tool_calls.iter().flatten();
    for function in calls
        .filter_map(|c| c.function.as_ref())
        .chain(&message.function_call)
    {
        push_function(text, function)?;
    }
    if role == b"user" {
        text.mark_anchor();
    }
    Ok(())
}

fn push_function<'a>(
    text: &mut RoutingText<'a>,
    function: &Function<'a>,
) -> Result<(), ParseError> {
    let name = raw::opt_string(function.name, "tool_calls[].function.name")?;
    let args = function.arguments.map(|a| match raw::kind(a) {
        raw::Kind::String => raw::string(a, "arguments"),
        _ => Ok(a.get().as_bytes()),
    });
    push_call(text, name, args.transpose()?);
    Ok(())
}
