//! The bad-input corpus: over 200 malformed and hostile requests. Each must get its documented
//! 4xx (with the OpenAI error JSON when the router's code answers; Pingora's HTTP parser
//! answers malformed request heads with a bare 400) within a bounded time, no backend may
//! receive any of them, the router must keep serving, and no load may be left behind.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::*;

/// One hostile request.
struct Case {
    name: String,
    /// The whole request as sent, or its head and a body sent slowly (see `Slow`).
    request: Vec<u8>,
    status: u16,
    /// Whether the router's own JSON error is expected (false: Pingora's bare 400).
    json: bool,
    slow: Option<Slow>,
}

/// A body that trickles in, or stops.
#[derive(Clone, Copy)]
struct Slow {
    /// Body bytes sent after the head, one at a time.
    bytes: usize,
    /// Pause between them.
    pause: Duration,
}

fn http(path: &str, body: &[u8]) -> Vec<u8> {
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    [head.as_bytes(), body].concat()
}

fn case(name: impl Into<String>, path: &str, body: &[u8], status: u16) -> Case {
    Case {
        name: name.into(),
        request: http(path, body),
        status,
        json: true,
        slow: None,
    }
}

const CHAT: &str = "/v1/chat/completions";

fn valid_chat() -> Value {
    json!({
        "model": "m",
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
        "session_params": {"session_id": "s"},
        "messages": [
            {"role": "system", "content": "You are helpful."},
            {"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": "data:x"}}]},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c", "content": "ok"}
        ]
    })
}

fn invalid_json() -> Vec<Case> {
    let texts = [
        "",
        " ",
        "{",
        "}",
        "[",
        "[]",
        "{]",
        "{\"messages\"",
        "{\"messages\":",
        "{\"messages\":[",
        "nul",
        "true",
        "123",
        "\"s\"",
        "{'messages': []}",
        "{messages: []}",
        "{\"messages\": [],}",
        "{\"a\" 1}",
        "{\"a\":1 \"b\":2}",
        "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]} trailing",
        "{\"messages\": [1 2]}",
        "{\"m\": tru}",
        "{\"m\": 01}",
        "{\"m\": 1.}",
        "{\"m\": -}",
        "{\"m\": 1e}",
        "{\"m\": .5}",
        "{\"m\": +1}",
        "{\"m\": NaN}",
        "{\"m\": Infinity}",
        "{\"m\": \"a\tb\"}",
        "{\"m\": \"\u{1}\"}",
        "\u{feff}{}",
        "{\"m\":\"x\"}}",
    ];
    texts
        .iter()
        .enumerate()
        .map(|(i, t)| case(format!("invalid json {i}"), CHAT, t.as_bytes(), 400))
        .collect()
}

fn truncated() -> Vec<Case> {
    let body = serde_json::to_vec(&valid_chat()).unwrap();
    (1..60)
        .map(|i| body.len() * i / 60)
        .map(|cut| case(format!("truncated at {cut}"), CHAT, &body[..cut], 400))
        .collect()
}

/// Replaces the value at `path` (keys and indexes) of `body` with `value`.
fn replaced(mut body: Value, path: &[&str], value: &Value) -> Value {
    let mut at = &mut body;
    for step in &path[..path.len() - 1] {
        at = match step.parse::<usize>() {
            Ok(i) => &mut at[i],
            Err(_) => &mut at[*step],
        };
    }
    let last = path[path.len() - 1];
    match last.parse::<usize>() {
        Ok(i) => at[i] = value.clone(),
        Err(_) => at[last] = value.clone(),
    }
    body
}

fn wrong_types() -> Vec<Case> {
    let fields: [(&[&str], &[Value]); 15] = [
        (
            &["model"],
            &[json!(1), json!(true), json!({}), json!([]), json!(null)],
        ),
        (
            &["messages"],
            &[json!(1), json!("s"), json!({}), json!(true), json!(null)],
        ),
        (
            &["messages", "0"],
            &[json!(1), json!("s"), json!([]), json!(null)],
        ),
        (
            &["messages", "0", "role"],
            &[json!(1), json!({}), json!([]), json!(null)],
        ),
        (
            &["messages", "0", "content"],
            &[json!(1), json!(true), json!({})],
        ),
        (
            &["messages", "1", "content", "0"],
            &[json!(1), json!("s"), json!([]), json!(null)],
        ),
        (
            &["messages", "1", "content", "0", "text"],
            &[json!(1), json!({}), json!([]), json!(null)],
        ),
        (
            &["messages", "1", "content", "0", "type"],
            &[json!(1), json!({}), json!([])],
        ),
        (
            &["messages", "2", "tool_calls"],
            &[json!(1), json!("s"), json!({})],
        ),
        (
            &["messages", "2", "tool_calls", "0"],
            &[json!(1), json!("s"), json!([])],
        ),
        (
            &["messages", "2", "tool_calls", "0", "function"],
            &[json!(1), json!("s"), json!([])],
        ),
        (
            &["messages", "2", "tool_calls", "0", "function", "name"],
            &[json!(1), json!({}), json!([])],
        ),
        (&["tools"], &[json!(1), json!("s"), json!({}), json!(true)]),
        (&["session_params"], &[json!(1), json!("s"), json!([])]),
        (
            &["session_params", "session_id"],
            &[json!(true), json!({}), json!([])],
        ),
    ];
    let mut cases = Vec::new();
    for (path, values) in fields {
        for value in values {
            let body = serde_json::to_vec(&replaced(valid_chat(), path, value)).unwrap();
            cases.push(case(
                format!("{} = {value}", path.join(".")),
                CHAT,
                &body,
                400,
            ));
        }
    }
    cases
}

fn other_endpoints() -> Vec<Case> {
    let completions: [Value; 14] = [
        json!({}),
        json!({"prompt": null}),
        json!({"prompt": ""}),
        json!({"prompt": 5}),
        json!({"prompt": true}),
        json!({"prompt": {}}),
        json!({"prompt": [true]}),
        json!({"prompt": [{}]}),
        json!({"prompt": [1, "a"]}),
        json!({"prompt": [-1]}),
        json!({"prompt": [1.5]}),
        json!({"prompt": [99999999999u64]}),
        json!({"prompt": [[1], ["a"]]}),
        json!({"prompt": [null]}),
    ];
    let responses: [Value; 13] = [
        json!({}),
        json!({"input": null}),
        json!({"input": ""}),
        json!({"input": []}),
        json!({"input": 5}),
        json!({"input": {}}),
        json!({"input": [1]}),
        json!({"input": ["s"]}),
        json!({"input": [{"content": "no role"}]}),
        json!({"input": [{"role": 1, "content": "x"}]}),
        json!({"input": "x", "instructions": 5}),
        json!({"input": "x", "tools": {}}),
        json!({"input": [{"type": "function_call", "name": 5}]}),
    ];
    let empty_chat = [
        json!({}),
        json!({"messages": []}),
        json!({"messages": null}),
        json!({"messages": [{}]}),
    ];
    let mut cases = Vec::new();
    for (path, bodies) in [
        ("/v1/completions", &completions[..]),
        ("/v1/responses", &responses[..]),
        (CHAT, &empty_chat[..]),
    ] {
        for body in bodies {
            cases.push(case(
                format!("{path} {body}"),
                path,
                &serde_json::to_vec(body).unwrap(),
                400,
            ));
        }
    }
    cases
}

fn encodings() -> Vec<Case> {
    let chat_with = |content: &[u8]| {
        [
            br#"{"messages":[{"role":"user","content":""#.as_slice(),
            content,
            br#""}]}"#,
        ]
        .concat()
    };
    let bodies: [(&str, Vec<u8>); 14] = [
        ("invalid utf-8", chat_with(b"\xff\xfe")),
        ("overlong utf-8", chat_with(b"\xc0\xaf")),
        ("lone continuation byte", chat_with(b"\x80")),
        ("truncated utf-8", chat_with(b"\xe4\xb8")),
        ("utf-8 surrogate", chat_with(b"\xed\xa0\x80")),
        ("bad escape", chat_with(br"\x41")),
        ("lone high surrogate", chat_with(br"\ud800")),
        ("lone low surrogate", chat_with(br"\udc00")),
        ("high then non-low", chat_with(br"\ud800\u0041")),
        ("truncated unicode escape", chat_with(br"\u12")),
        ("non-hex unicode escape", chat_with(br"\uzzzz")),
        ("raw newline in string", chat_with(b"a\nb")),
        ("nul byte in string", chat_with(b"a\x00b")),
        (
            "escape at end of body",
            br#"{"messages":[{"role":"user","content":"\"#.to_vec(),
        ),
    ];
    bodies
        .into_iter()
        .map(|(name, body)| case(name, CHAT, &body, 400))
        .collect()
}

fn huge() -> Vec<Case> {
    let deep = |prefix: &str| {
        format!("{prefix}{}{}", "[".repeat(100_000), "]".repeat(100_000)).into_bytes()
    };
    let twenty_mb = "x".repeat(20 << 20);
    vec![
        case(
            "nesting 100,000 deep in content",
            CHAT,
            &[
                deep(r#"{"messages":[{"role":"user","content":"#),
                b"}]}".to_vec(),
            ]
            .concat(),
            400,
        ),
        case(
            "nesting 100,000 deep in an unknown field",
            CHAT,
            &[deep(r#"{"x":"#), b"}".to_vec()].concat(),
            400,
        ),
        case(
            "nesting 100,000 deep objects",
            CHAT,
            "{\"a\":".repeat(100_000).as_bytes(),
            400,
        ),
        case(
            "huge token id",
            "/v1/completions",
            br#"{"prompt":[1e999999]}"#,
            400,
        ),
        case(
            "huge integer token id",
            "/v1/completions",
            br#"{"prompt":[123456789012345678901234567890]}"#,
            400,
        ),
        case(
            "20 MB string where messages go",
            CHAT,
            format!(r#"{{"messages":"{twenty_mb}"}}"#).as_bytes(),
            400,
        ),
        case(
            "unterminated 20 MB string",
            CHAT,
            format!(r#"{{"messages":[{{"role":"user","content":"{twenty_mb}"#).as_bytes(),
            400,
        ),
    ]
}

fn raw_case(name: &str, request: &str, status: u16, json: bool) -> Case {
    Case {
        name: name.into(),
        request: request.as_bytes().to_vec(),
        status,
        json,
        slow: None,
    }
}

fn framing() -> Vec<Case> {
    let long_header = format!(
        "POST {CHAT} HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\nContent-Length: 2\r\n\r\n{{}}",
        "a".repeat(1 << 20)
    );
    let many_headers = format!(
        "POST {CHAT} HTTP/1.1\r\nHost: x\r\n{}Content-Length: 2\r\n\r\n{{}}",
        "X-A: b\r\n".repeat(300)
    );
    vec![
        raw_case(
            "two content-lengths",
            &format!(
                "POST {CHAT} HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{{}}"
            ),
            400,
            true,
        ),
        raw_case(
            "content-length and chunked",
            &format!(
                "POST {CHAT} HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n0\r\n\r\n"
            ),
            400,
            true,
        ),
        raw_case(
            "content-length not a number",
            &format!(
                "POST {CHAT} HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\nConnection: close\r\n\r\n"
            ),
            400,
            false,
        ),
        raw_case(
            "negative content-length",
            &format!(
                "POST {CHAT} HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\nConnection: close\r\n\r\n"
            ),
            400,
            false,
        ),
        raw_case(
            "bad chunk size",
            &format!(
                "POST {CHAT} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\nzz\r\n{{}}\r\n0\r\n\r\n"
            ),
            400,
            true,
        ),
        raw_case(
            "declared over the limit",
            &format!(
                "POST {CHAT} HTTP/1.1\r\nHost: x\r\nContent-Length: 40000000\r\nConnection: close\r\n\r\n"
            ),
            413,
            true,
        ),
        raw_case("header over 1 MiB", &long_header, 400, false),
        raw_case("300 headers", &many_headers, 400, false),
        raw_case(
            "admin path on the data plane",
            "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
            404,
            true,
        ),
        raw_case(
            "reload on the data plane",
            "POST /reload HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            404,
            true,
        ),
        raw_case(
            "add worker on the data plane",
            "POST /add_worker?url=http://10.0.0.1:80 HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            404,
            true,
        ),
    ]
}

fn slow() -> Vec<Case> {
    let head = |len: usize| {
        format!(
            "POST {CHAT} HTTP/1.1\r\nHost: x\r\nContent-Length: {len}\r\nConnection: close\r\n\r\n"
        )
        .into_bytes()
    };
    vec![
        Case {
            name: "slowloris body".into(),
            request: head(1000),
            status: 408,
            json: true,
            slow: Some(Slow {
                bytes: 100,
                pause: Duration::from_millis(200),
            }),
        },
        Case {
            name: "body that stops midway".into(),
            request: head(1000),
            status: 408,
            json: true,
            slow: Some(Slow {
                bytes: 10,
                pause: Duration::ZERO,
            }),
        },
    ]
}

fn corpus() -> Vec<Case> {
    [
        invalid_json(),
        truncated(),
        wrong_types(),
        other_endpoints(),
        encodings(),
        huge(),
        framing(),
        slow(),
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// Sends a case and reads the whole answer (the router closes the connection).
async fn send(url: &str, case: &Case) -> String {
    let mut stream = TcpStream::connect(url.trim_start_matches("http://"))
        .await
        .unwrap();
    let _ = stream.write_all(&case.request).await;
    if let Some(slow) = case.slow {
        for _ in 0..slow.bytes {
            if stream.write_all(b" ").await.is_err() {
                break;
            }
            tokio::time::sleep(slow.pause).await;
        }
    }
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(15), stream.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_bad_request_gets_its_4xx_and_reaches_no_backend() {
    let up = TestUpstream::start("a").await;
    let mut s = settings(&[&up]);
    s.client_read_timeout = Some(1.0);
    s.client_body_timeout = Some(3.0);
    let router = TestRouter::start(s, 1);
    let cases = corpus();
    assert!(cases.len() >= 200, "the corpus has {} cases", cases.len());
    for case in &cases {
        let started = Instant::now();
        let response = send(&router.url, case).await;
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "{}: no answer in time",
            case.name
        );
        assert_eq!(
            status_of(&response),
            case.status,
            "{}: {response:.300}",
            case.name
        );
        if case.json {
            let body = response.split("\r\n\r\n").nth(1).unwrap_or_default();
            let error: Value = serde_json::from_str(body)
                .unwrap_or_else(|_| panic!("{}: not JSON: {body:.200}", case.name));
            assert!(
                error["error"]["message"].is_string() && error["error"]["code"].is_string(),
                "{}",
                case.name
            );
        }
    }
    assert_eq!(up.count(), 0, "a rejected request reached the backend");
    router
        .wait_until("in-flight is zero", |r| r.inflight() == 0)
        .await;
    let (status, _) = post(
        &router.url,
        CHAT,
        &chat(&[("user", "still serving".into())]),
    )
    .await;
    assert_eq!(status, 200);
    eprintln!("{} bad requests refused", cases.len());
}
