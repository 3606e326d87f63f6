//! Message content shared by the chat and responses APIs: a plain string, or an array of
//! typed parts of which text is routed on and media (images, audio, files) become short
//! digests of their data. Also the markers that frame roles, tools and tool calls.

use super::ParseError;
use super::json::{Json, Kind};
use super::text::{Mark, RoutingText};

/// Inserts the role marker that opens a message at `at`.
pub fn insert_role<'a>(text: &mut RoutingText<'a>, at: Mark, role: &'a [u8]) {
    text.insert(at, &[b"\n<|", role, b"|>\n"]);
}

/// Appends one function call: its name and its arguments as sent.
pub fn push_call<'a>(text: &mut RoutingText<'a>, name: Option<&'a [u8]>, args: Option<&'a [u8]>) {
    text.push(b"\n<call>");
    text.push(name.unwrap_or_default());
    text.push(b"(");
    text.push(args.unwrap_or_default());
    text.push(b")");
}

/// A string field, or `WrongType` naming it.
pub fn string<'a>(j: &mut Json<'a>, field: &'static str) -> Result<&'a [u8], ParseError> {
    match j.kind() {
        Kind::String => j.string(),
        _ => Err(ParseError::WrongType {
            field,
            expected: "a string",
        }),
    }
}

/// Function arguments: a string's escaped bytes, or any other value as it stands.
pub fn arguments<'a>(j: &mut Json<'a>) -> Result<&'a [u8], ParseError> {
    match j.kind() {
        Kind::String => j.string(),
        _ => j.raw(),
    }
}

/// Appends a content value: a string, an array of parts, or null (nothing).
pub fn push_content<'a>(
    j: &mut Json<'a>,
    text: &mut RoutingText<'a>,
    field: &'static str,
) -> Result<(), ParseError> {
    match j.kind() {
        Kind::String => text.push(j.string()?),
        Kind::Array => j.array(|j| push_part(j, text))?,
        Kind::Null => j.null()?,
        _ => {
            return Err(ParseError::WrongType {
                field,
                expected: "a string or an array of content parts",
            });
        }
    }
    Ok(())
}

/// Tags of media parts, by the key that carries their data.
const MEDIA: [(&[u8], &[u8]); 7] = [
    (b"image_url", b"<image:"),
    (b"input_audio", b"<audio:"),
    (b"video_url", b"<video:"),
    (b"file", b"<file:"),
    (b"file_data", b"<file:"),
    (b"file_id", b"<file:"),
    (b"file_url", b"<file:"),
];

/// One element of a content array, in either API's vocabulary.
fn push_part<'a>(j: &mut Json<'a>, text: &mut RoutingText<'a>) -> Result<(), ParseError> {
    let (mut body, mut media, mut kind) = (None, None, None);
    j.object(|j, key| {
        match key {
            b"text" | b"refusal" => body = Some(string(j, "content[].text")?),
            b"type" => kind = Some(string(j, "content[].type")?),
            _ => match MEDIA.iter().find(|(k, _)| *k == key) {
                Some((_, tag)) => media = Some((*tag, j.raw()?)),
                None => j.skip()?,
            },
        }
        Ok(())
    })?;
    match (body, media) {
        (Some(body), _) => text.push(body),
        (None, Some((tag, data))) => text.push_digest(tag, data),
        (None, None) => text.push_digest(b"<part:", kind.unwrap_or(b"unknown")),
    }
    Ok(())
}
