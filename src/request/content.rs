//! Message content shared by the chat and responses APIs: a plain string, or an array of
//! typed parts of which text is routed on and media (images, audio, files) become short
//! digests of their data. Also the markers that frame roles, tools and tool calls.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;

use super::ParseError;
use super::raw::{self, Kind};
use super::text::RoutingText;

/// One element of a content array, in either API's vocabulary.
#[derive(Deserialize)]
struct ContentPart<'a> {
    #[serde(borrow, rename = "type")]
    kind: Option<Cow<'a, str>>,
    #[serde(borrow)]
    text: Option<&'a RawValue>,
    #[serde(borrow)]
    refusal: Option<&'a RawValue>,
    #[serde(borrow)]
    image_url: Option<&'a RawValue>,
    #[serde(borrow)]
    input_audio: Option<&'a RawValue>,
    #[serde(borrow)]
    file: Option<&'a RawValue>,
    #[serde(borrow)]
    file_data: Option<&'a RawValue>,
    #[serde(borrow)]
    file_id: Option<&'a RawValue>,
    #[serde(borrow)]
    video_url: Option<&'a RawValue>,
}

/// Appends the role marker that opens a message.
pub fn push_role<'a>(text: &mut RoutingText<'a>, role: &'a [u8]) {
    text.push(b"\n<|");
    text.push(role);
    text.push(b"|>\n");
}

/// Appends tool definitions first, as chat templates render them.
pub fn push_tools<'a>(text: &mut RoutingText<'a>, tools: Option<&'a RawValue>) {
    if let Some(tools) = tools {
        text.push(b"<tools>");
        text.push(tools.get().as_bytes());
        text.push(b"</tools>");
    }
}

/// Appends one function call: its name and its arguments as sent.
pub fn push_call<'a>(text: &mut RoutingText<'a>, name: Option<&'a [u8]>, args: Option<&'a [u8]>) {
    text.push(b"\n<call>");
    text.push(name.unwrap_or_default());
    text.push(b"(");
    text.push(args.unwrap_or_default());
    text.push(b")");
}

/// Appends a content value: a string, an array of parts, or null (nothing).
pub fn push_content<'a>(
    text: &mut RoutingText<'a>,
    content: Option<&'a RawValue>,
    field: &'static str,
) -> Result<(), ParseError> {
    let Some(content) = content else {
        return Ok(());
    };
    match raw::kind(content) {
        Kind::String => text.push(raw::string(content, field)?),
        Kind::Array => push_parts(text, content)?,
        _ => {
            return Err(ParseError::WrongType {
                field,
                expected: "a string or an array of content parts",
            });
        }
    }
    Ok(())
}

fn push_parts<'a>(text: &mut RoutingText<'a>, content: &'a RawValue) -> Result<(), ParseError> {
    let parts: Vec<ContentPart<'a>> = serde_json::from_str(content.get())?;
    for part in &parts {
        push_part(text, part)?;
    }
    Ok(())
}

fn push_part<'a>(text: &mut RoutingText<'a>, part: &ContentPart<'a>) -> Result<(), ParseError> {
    if let Some(body) = part.text.or(part.refusal) {
        text.push(raw::string(body, "content[].text")?);
        return Ok(());
    }
    let media = [
        (b"<image:".as_slice(), part.image_url),
        (b"<audio:", part.input_audio),
        (b"<video:", part.video_url),
        (b"<file:", part.file.or(part.file_data).or(part.file_id)),
    ];
    match media.iter().find_map(|(tag, data)| data.map(|d| (*tag, d))) {
        Some((tag, data)) => text.push_digest(tag, data.get().as_bytes()),
        None => {
            let kind = part.kind.as_deref().unwrap_or("unknown");
            text.push_digest(b"<part:", kind.as_bytes());
        }
    }
    Ok(())
}
