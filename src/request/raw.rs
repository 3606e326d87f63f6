//! Helpers over `serde_json::value::RawValue`: the bytes of a JSON value as they stand in
//! the body, checked for the type a field must have. Nothing here copies or unescapes.

use serde_json::value::RawValue;

use super::ParseError;

/// What a raw JSON value is, from its first byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    String,
    Array,
    Object,
    Other,
}

/// The kind of a raw value.
pub fn kind(raw: &RawValue) -> Kind {
    match raw.get().as_bytes().first() {
        Some(b'"') => Kind::String,
        Some(b'[') => Kind::Array,
        Some(b'{') => Kind::Object,
        _ => Kind::Other,
    }
}

/// The escaped bytes between the quotes of a JSON string, or `WrongType` naming `field`.
pub fn string<'a>(raw: &'a RawValue, field: &'static str) -> Result<&'a [u8], ParseError> {
    let bytes = raw.get().as_bytes();
    match kind(raw) {
        // A raw JSON string is at least the two quotes.
        Kind::String if bytes.len() >= 2 => Ok(&bytes[1..bytes.len() - 1]),
        _ => Err(ParseError::WrongType {
            field,
            expected: "a string",
        }),
    }
}

/// Like [`string`] for an optional field: absent or null is `None`.
pub fn opt_string<'a>(
    raw: Option<&'a RawValue>,
    field: &'static str,
) -> Result<Option<&'a [u8]>, ParseError> {
    raw.map(|r| string(r, field)).transpose()
}

/// The bytes of an array without its closing bracket, so that an array extended at its end
/// starts with the bytes of the shorter one (`[1,2` is a prefix of `[1,2,3`).
pub fn open_array(raw: &RawValue) -> &[u8] {
    let bytes = raw.get().as_bytes();
    &bytes[..bytes.len().saturating_sub(1)]
}

/// Requires `raw` to be an array, naming `field` otherwise.
pub fn require_array(raw: &RawValue, field: &'static str) -> Result<(), ParseError> {
    match kind(raw) {
        Kind::Array => Ok(()),
        _ => Err(ParseError::WrongType {
            field,
            expected: "an array",
        }),
    }
}

/// A session id: a JSON string (its escaped bytes) or a number (its digits).
pub fn id<'a>(raw: &'a RawValue, field: &'static str) -> Result<&'a [u8], ParseError> {
    match kind(raw) {
        Kind::String => string(raw, field),
        Kind::Other if matches!(raw.get().as_bytes().first(), Some(b'0'..=b'9' | b'-')) => {
            Ok(raw.get().as_bytes())
        }
        _ => Err(ParseError::WrongType {
            field,
            expected: "a string or a number",
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(text: &str) -> &RawValue {
        serde_json::from_str(text).unwrap()
    }

    #[test]
    fn string_keeps_escapes() {
        assert_eq!(string(raw(r#""a\nb""#), "f").unwrap(), br"a\nb");
        assert!(string(raw("1"), "f").is_err());
    }

    #[test]
    fn open_array_drops_only_the_bracket() {
        assert_eq!(open_array(raw("[1,2]")), b"[1,2");
    }

    #[test]
    fn ids_are_strings_or_numbers() {
        assert_eq!(id(raw("42"), "f").unwrap(), b"42");
        assert_eq!(id(raw(r#""s-1""#), "f").unwrap(), b"s-1");
        assert!(id(raw("null"), "f").is_err());
        assert!(id(raw("{}"), "f").is_err());
    }
}
