//! `/v1/messages` (Anthropic's Messages API, as vLLM serves it): the conversation in the
//! order vLLM hands it to the chat template, so that the routing text is the text the
//! engine caches, and a conversation an adapter turns into chat keeps its prefix.
//!
//! - **System first.** `system` (a string or text blocks) is a system message at the front.
//!   A text block starting `x-anthropic-billing-header` (Claude Code's per-session
//!   attribution line) is left out, as vLLM leaves it out.
//! - **Then each message in order.** A `role: "system"` message stays where it is, as vLLM
//!   0.32 keeps it for a template that accepts it (it merges it into the front only for
//!   one that does not, which token mode knows and text mode does not: in place keeps each
//!   turn's text an extension of the last). A user message's `tool_result` blocks come
//!   first, each a tool message, then its own text (no marker at all when it has none); an
//!   assistant's text comes before its `tool_use` calls. Images become digests of their
//!   source, as in chat; thinking is left out, as chat leaves out `reasoning`.
//!
//! `system` and `messages` are kept as raw slices while the body is read (either may come
//! first) and walked in [`push`] once it is read, without a copy.

use super::ParseError;
use super::content::{insert_role, push_call, string};
use super::json::{Json, Kind};
use super::text::{Mark, RoutingText};

/// Claude Code's attribution line, which vLLM strips from the system prompt.
const BILLING: &[u8] = b"x-anthropic-billing-header";

/// Checks that `system` is a string or an array, and returns it as it stands.
pub fn system<'a>(j: &mut Json<'a>) -> Result<&'a [u8], ParseError> {
    match j.kind() {
        Kind::String | Kind::Array | Kind::Null => j.raw(),
        _ => Err(ParseError::WrongType {
            field: "system",
            expected: "a string or an array of text blocks",
        }),
    }
}

/// Checks that `messages` is an array, and returns it as it stands.
pub fn messages<'a>(j: &mut Json<'a>) -> Result<&'a [u8], ParseError> {
    match j.kind() {
        Kind::Array => j.raw(),
        _ => Err(ParseError::WrongType {
            field: "messages",
            expected: "an array",
        }),
    }
}

/// Appends the system message, then every message. The system field, else a first message
/// of role `system`, is the system prompt, marked as such.
pub fn push<'a>(
    system: Option<&'a [u8]>,
    messages: &'a [u8],
    text: &mut RoutingText<'a>,
) -> Result<(), ParseError> {
    if let Some(system) = system {
        push_system(&mut Json::new(system), text, "system")?;
        text.mark_system_end();
    }
    let mut count = 0;
    each(messages, |m| {
        count += 1;
        match m.role {
            b"system" => {
                push_system(&mut Json::new(m.content), text, "messages[].content")?;
                if count == 1 {
                    text.mark_system_end();
                }
                Ok(())
            }
            _ => push_message(&m, text),
        }
    })?;
    match count {
        0 => Err(ParseError::Empty("messages")),
        _ => Ok(()),
    }
}

/// A system message of the text of `j`, when it has any but the attribution line.
fn push_system<'a>(
    j: &mut Json<'a>,
    text: &mut RoutingText<'a>,
    field: &'static str,
) -> Result<(), ParseError> {
    let start = text.mark();
    push_text(j, text, field)?;
    if text.mark() != start {
        insert_role(text, start, b"system");
    }
    Ok(())
}

/// One message: its role and its content as it stands.
struct Message<'a> {
    role: &'a [u8],
    content: &'a [u8],
}

fn each<'a>(
    messages: &'a [u8],
    mut visit: impl FnMut(Message<'a>) -> Result<(), ParseError>,
) -> Result<(), ParseError> {
    Json::new(messages).array(|j| {
        if j.kind() != Kind::Object {
            return Err(ParseError::WrongType {
                field: "messages[]",
                expected: "an object",
            });
        }
        let (mut role, mut content) = (None, None);
        j.object(|j, key| {
            match key {
                b"role" => role = Some(string(j, "messages[].role")?),
                b"content" => content = Some(j.raw()?),
                _ => j.skip()?,
            }
            Ok(())
        })?;
        visit(Message {
            role: role.ok_or(ParseError::Missing("messages[].role"))?,
            content: content.ok_or(ParseError::Missing("messages[].content"))?,
        })
    })
}

/// The text of a string or of an array's text blocks, but the attribution line.
fn push_text<'a>(
    j: &mut Json<'a>,
    text: &mut RoutingText<'a>,
    field: &'static str,
) -> Result<(), ParseError> {
    let mut keep = |body: &'a [u8]| {
        if !body.starts_with(BILLING) {
            text.push(body);
        }
    };
    match j.kind() {
        Kind::String => keep(j.string()?),
        Kind::Null => j.null()?,
        Kind::Array => j.array(|j| {
            let block = ContentBlock::read(j)?;
            if let (Some(b"text"), Some(body)) = (block.kind, block.text) {
                keep(body);
            }
            Ok(())
        })?,
        _ => {
            return Err(ParseError::WrongType {
                field,
                expected: "a string or an array of content blocks",
            });
        }
    }
    Ok(())
}

/// The fields of a content block that routing reads.
#[derive(Default)]
struct ContentBlock<'a> {
    kind: Option<&'a [u8]>,
    text: Option<&'a [u8]>,
    source: Option<&'a [u8]>,
    name: Option<&'a [u8]>,
    input: Option<&'a [u8]>,
    content: Option<&'a [u8]>,
}

impl<'a> ContentBlock<'a> {
    fn read(j: &mut Json<'a>) -> Result<ContentBlock<'a>, ParseError> {
        if j.kind() != Kind::Object {
            return Err(ParseError::WrongType {
                field: "content[]",
                expected: "an object",
            });
        }
        let mut block = ContentBlock::default();
        j.object(|j, key| {
            match key {
                b"type" => block.kind = Some(string(j, "content[].type")?),
                b"text" => block.text = Some(string(j, "content[].text")?),
                b"name" => block.name = Some(string(j, "content[].name")?),
                b"source" => block.source = Some(j.raw()?),
                b"input" => block.input = Some(j.raw()?),
                b"content" => block.content = Some(j.raw()?),
                _ => j.skip()?,
            }
            Ok(())
        })?;
        Ok(block)
    }

    /// What it adds to its message's own content: text, or a digest of other data.
    fn push_content(&self, text: &mut RoutingText<'a>) {
        match self.kind.unwrap_or_default() {
            b"text" => text.push(self.text.unwrap_or_default()),
            b"image" | b"document" => {
                let tag: &[u8] = if self.kind == Some(b"image") {
                    b"<image:"
                } else {
                    b"<file:"
                };
                text.push_digest(tag, self.source.unwrap_or_default());
            }
            b"tool_use" | b"tool_result" | b"thinking" | b"redacted_thinking"
            | b"tool_reference" => {}
            other => text.push_digest(b"<part:", other),
        }
    }
}

/// A message other than a system one: its blocks are read three times over (tool
/// results, then its own content, then its calls), which needs no list of them.
fn push_message<'a>(m: &Message<'a>, text: &mut RoutingText<'a>) -> Result<(), ParseError> {
    let mut j = Json::new(m.content);
    match j.kind() {
        Kind::String => {
            let start = text.mark();
            text.push(j.string()?);
            open(text, start, m.role);
            return Ok(());
        }
        Kind::Array | Kind::Null => {}
        _ => {
            return Err(ParseError::WrongType {
                field: "messages[].content",
                expected: "a string or an array of content blocks",
            });
        }
    }
    if m.role == b"user" {
        each_block(
            m.content,
            |b, text| {
                let (Some(b"tool_result"), start) = (b.kind, text.mark()) else {
                    return Ok(());
                };
                if let Some(content) = b.content {
                    push_tool_result(&mut Json::new(content), text)?;
                }
                insert_role(text, start, b"tool");
                Ok(())
            },
            text,
        )?;
    }
    let start = text.mark();
    each_block(
        m.content,
        |b, text| {
            b.push_content(text);
            Ok(())
        },
        text,
    )?;
    each_block(
        m.content,
        |b, text| {
            if b.kind == Some(b"tool_use") {
                push_call(text, b.name, b.input);
            }
            Ok(())
        },
        text,
    )?;
    open(text, start, m.role);
    Ok(())
}

/// Calls `visit` with each block of a content array (nothing for null).
fn each_block<'a>(
    content: &'a [u8],
    mut visit: impl FnMut(&ContentBlock<'a>, &mut RoutingText<'a>) -> Result<(), ParseError>,
    text: &mut RoutingText<'a>,
) -> Result<(), ParseError> {
    let mut j = Json::new(content);
    if j.kind() == Kind::Null {
        return Ok(());
    }
    j.array(|j| visit(&ContentBlock::read(j)?, text))
}

/// Puts the role marker in front of what a message added from `start`. A user message
/// that added nothing (only tool results) gets none, as vLLM drops it; one that did marks
/// the anchor.
fn open<'a>(text: &mut RoutingText<'a>, start: Mark, role: &'a [u8]) {
    let user = role == b"user";
    if user && text.mark() == start {
        return;
    }
    insert_role(text, start, role);
    if user {
        text.mark_anchor();
    }
}

/// A tool result's content: a string, or blocks whose text counts and whose images
/// become digests.
fn push_tool_result<'a>(j: &mut Json<'a>, text: &mut RoutingText<'a>) -> Result<(), ParseError> {
    match j.kind() {
        Kind::String => text.push(j.string()?),
        Kind::Array => j.array(|j| {
            ContentBlock::read(j)?.push_content(text);
            Ok(())
        })?,
        _ => j.skip()?,
    }
    Ok(())
}
