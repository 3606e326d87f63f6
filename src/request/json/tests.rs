//! Tests of the JSON reader, unit and differential against serde_json.

use proptest::prelude::*;
use serde_json::Value;

use super::*;

fn skips(text: &str) -> Result<(), ParseError> {
    let mut j = Json::new(text.as_bytes());
    j.skip()?;
    j.end()
}

#[test]
fn strings_come_back_escaped() {
    let mut j = Json::new(br#"  "a\"b\\c\u00e9\ud83d\ude00\n" "#);
    assert_eq!(j.string().unwrap(), br#"a\"b\\c\u00e9\ud83d\ude00\n"#);
    assert!(j.end().is_ok());
}

#[test]
fn objects_and_arrays_are_walked_in_order() {
    let mut j = Json::new(br#"{"a": [1, {"x": []}, "s"], "b": {}, "c": null}"#);
    let mut keys = Vec::new();
    j.object(|j, key| {
        keys.push(String::from_utf8_lossy(key).into_owned());
        j.skip()
    })
    .unwrap();
    assert_eq!(keys, ["a", "b", "c"]);
}

#[test]
fn raw_is_the_exact_value() {
    let mut j = Json::new(br#"{"t": [ {"a":1} , 2 ] , "u": 3}"#);
    let mut raw = None;
    j.object(|j, key| {
        match key {
            b"t" => raw = Some(j.raw()?),
            _ => j.skip()?,
        }
        Ok(())
    })
    .unwrap();
    assert_eq!(raw.unwrap(), br#"[ {"a":1} , 2 ]"#);
}

#[test]
fn malformed_input_is_refused() {
    let bad = [
        "",
        "{",
        "[1,]",
        "[1 2]",
        "{\"a\"}",
        "{\"a\":}",
        "{a:1}",
        "tru",
        "nul",
        "-",
        "1.",
        "1e",
        "\"abc",
        "\"a\\x\"",
        "\"a\\ud800\"",
        "\"\\udc00\"",
        "\"\\u12\"",
        "\"\\uzzzz\"",
        "\"tab\there\"",
        "[1]]",
        "{}}",
        "{\"a\":1,}",
    ];
    for text in bad {
        assert!(skips(text).is_err(), "{text:?} was accepted");
    }
}

#[test]
fn nesting_is_bounded() {
    assert!(
        skips(&format!(
            "{}{}",
            "[".repeat(MAX_DEPTH),
            "]".repeat(MAX_DEPTH)
        ))
        .is_ok()
    );
    let deep = format!("{}{}", "[".repeat(MAX_DEPTH + 1), "]".repeat(MAX_DEPTH + 1));
    assert!(matches!(skips(&deep), Err(ParseError::TooDeep { .. })));
    let huge = "[{\"a\":".repeat(100_000);
    assert!(matches!(skips(&huge), Err(ParseError::TooDeep { .. })));
}

fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        "[a-z\"\\\\\n\u{e9}\u{1f600}\u{1}]{0,12}".prop_map(Value::String),
    ];
    leaf.prop_recursive(5, 64, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map("[a-z]{0,4}", inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    #[test]
    fn accepts_everything_serde_writes(value in any_json(), pretty in any::<bool>()) {
        let text = match pretty {
            true => serde_json::to_string_pretty(&value).unwrap(),
            false => serde_json::to_string(&value).unwrap(),
        };
        let mut j = Json::new(text.as_bytes());
        prop_assert_eq!(j.raw().unwrap(), text.trim().as_bytes());
        prop_assert!(j.end().is_ok());
    }

    #[test]
    fn agrees_with_serde_on_cut_and_damaged_text(value in any_json(), cut in any::<prop::sample::Index>(), junk in "[\\[\\]{}\",:0-9a-z ]{0,3}") {
        let text = serde_json::to_string(&value).unwrap();
        let at = cut.index(text.len() + 1);
        let mut damaged = text.as_bytes()[..at].to_vec();
        damaged.extend_from_slice(junk.as_bytes());
        damaged.extend_from_slice(&text.as_bytes()[at..]);
        let Ok(damaged) = String::from_utf8(damaged) else { return Ok(()) };
        let serde_ok = serde_json::from_str::<serde::de::IgnoredAny>(&damaged).is_ok();
        prop_assert_eq!(skips(&damaged).is_ok(), serde_ok, "{}", damaged);
    }
}

proptest! {
    #[test]
    fn special_finds_the_first_quote_backslash_or_control(bytes in prop::collection::vec(any::<u8>(), 0..64)) {
        let expected = bytes.iter().position(|&b| b == b'"' || b == b'\\' || b < 0x20);
        prop_assert_eq!(special(&bytes), expected);
    }
}

proptest! {
    #[test]
    fn block_classes_match_the_byte_at_a_time_ones(block in prop::array::uniform16(any::<u8>())) {
        prop_assert_eq!(classify(&block), portable_classify(&block));
    }
}
