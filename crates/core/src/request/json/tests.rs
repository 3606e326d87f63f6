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

#[cfg(target_arch = "x86_64")]
proptest! {
    #[test]
    #[allow(unsafe_code)]
    fn wide_block_classes_match_the_byte_at_a_time_ones(block in prop::array::uniform32(any::<u8>())) {
        prop_assume!(std::is_x86_feature_detected!("avx2"));
        // SAFETY: the CPU has AVX2 (assumed just above).
        let wide = unsafe { simd::classify_avx2(&block) };
        let half = |i: usize| portable_classify(block[i..i + 16].try_into().unwrap());
        let (lo, hi) = (half(0), half(16));
        prop_assert_eq!(wide.quote, lo.quote | hi.quote << 16);
        prop_assert_eq!(wide.backslash, lo.backslash | hi.backslash << 16);
        prop_assert_eq!(wide.control, lo.control | hi.control << 16);
        prop_assert_eq!(wide.simple, lo.simple | hi.simple << 16);
        prop_assert_eq!(wide.high, lo.high | hi.high << 16);
    }
}

/// Where the block scan of `width` bytes leaves a reader at the start of `text`'s contents.
fn scan_end(text: &[u8], width: usize) -> Result<(bool, usize), ParseError> {
    let mut j = Json::new(text);
    j.eat(b'"', "a string")?;
    let (ended, _) = match width {
        16 => j.scan_blocks::<16>(classify)?,
        _ => j.string_blocks()?,
    };
    Ok((ended, j.at))
}

proptest! {
    #[test]
    fn narrow_and_wide_block_scans_agree(s in "(\\PC|[\"\\\\\n\t\u{1}]){0,90}", junk in "[a-z\"\\\\]{0,3}") {
        let text = format!("{}{junk}", serde_json::to_string(&s).unwrap());
        let (narrow, wide) = (scan_end(text.as_bytes(), 16), scan_end(text.as_bytes(), 32));
        // Both find the closing quote at the same place, or both stop short of the end.
        match (narrow, wide) {
            (Ok((true, a)), Ok((true, b))) => prop_assert_eq!(a, b),
            (Ok((false, _)), Ok(_)) | (Ok(_), Ok((false, _))) => {}
            (n, w) => prop_assert_eq!(n.is_ok(), w.is_ok()),
        }
    }
}

proptest! {
    #[test]
    fn invalid_utf8_in_a_string_is_found_wherever_it_is(
        s in "[a-z\"\\\\\n]{0,80}", at in 0usize..100, bad in prop::sample::select(vec![
            &b"\xff"[..], b"\xc3", b"\xe2\x82", b"\xed\xa0\x80", b"\xc0\xaf"]),
    ) {
        let text = serde_json::to_string(&s).unwrap();
        let inner = &text.as_bytes()[1..text.len() - 1];
        let at = at.min(inner.len());
        // Only between whole characters or escapes: put it after an even run of backslashes.
        let at = (0..=at).rev().find(|&i| inner[..i].iter().rev().take_while(|&&b| b == b'\\').count() % 2 == 0).unwrap();
        let body = [b"{\"model\":\"", &inner[..at], bad, &inner[at..], b"\",\"messages\":[]}"].concat();
        prop_assert!(matches!(crate::request::parse(crate::request::Endpoint::Chat, &body), Err(ParseError::NotUtf8)));
    }
}
