//! Bodies reach the backend byte for byte: Content-Length and chunked, large and non-ASCII,
//! with `Expect: 100-continue`; unknown fields and formatting untouched.

use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use xxhash_rust::xxh3::xxh3_128;

use crate::support::*;

/// A chat body of about `len` bytes with non-ASCII text, odd spacing and unknown fields.
fn odd_body(len: usize) -> Bytes {
    let unit = "Grüße, 世界! \"quoted\" \\ back\nslash — ";
    let content = unit.repeat(len / unit.len() + 1);
    let escaped = serde_json::to_string(&content).unwrap();
    let text = format!(
        "{{ \"model\" : \"m\",\n \"x_unknown\": {{\"keep\": [1, 2.50, true]}},\n \"messages\": [ {{\"role\":\"user\", \"content\": {escaped} }} ] }}"
    );
    Bytes::from(text)
}

fn single_received(ups: &[TestUpstream]) -> Bytes {
    let all: Vec<_> = ups.iter().flat_map(|u| u.received()).collect();
    assert_eq!(all.len(), 1, "exactly one backend request expected");
    all[0].body.clone()
}

async fn routed_bytes_arrive_identical(body: Bytes, chunked: bool) {
    let ups = [
        TestUpstream::start("a").await,
        TestUpstream::start("b").await,
    ];
    let router = TestRouter::start(settings(&[&ups[0], &ups[1]]), 2);
    let request = client().post(format!("{}/v1/chat/completions", router.url));
    let request = if chunked {
        let pieces: Vec<Result<Bytes, std::io::Error>> = body
            .chunks(7919)
            .map(|c| Ok(Bytes::copy_from_slice(c)))
            .collect();
        request.body(reqwest::Body::wrap_stream(futures_util::stream::iter(
            pieces,
        )))
    } else {
        request.body(body.clone())
    };
    let resp = request.send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let received = single_received(&ups);
    assert_eq!(received.len(), body.len());
    assert_eq!(xxh3_128(&received), xxh3_128(&body));
    let framing = &ups
        .iter()
        .flat_map(|u| u.received())
        .next()
        .unwrap()
        .headers;
    assert_eq!(
        framing.contains_key("transfer-encoding"),
        chunked,
        "{framing:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn content_length_body_is_byte_identical() {
    routed_bytes_arrive_identical(odd_body(10_000), false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunked_body_is_byte_identical() {
    routed_bytes_arrive_identical(odd_body(300_000), true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_megabyte_body_is_byte_identical() {
    routed_bytes_arrive_identical(odd_body(5 << 20), false).await;
    routed_bytes_arrive_identical(odd_body(5 << 20), true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expect_continue_is_answered_then_body_relayed() {
    let up = TestUpstream::start("a").await;
    let router = TestRouter::start(settings(&[&up]), 1);
    let body = odd_body(100_000);
    let addr = router.url.trim_start_matches("http://").to_string();
    let mut stream = TcpStream::connect(&addr).await.unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nExpect: 100-continue\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut interim = [0u8; 25];
    let read = tokio::time::timeout(Duration::from_secs(5), stream.read_exact(&mut interim)).await;
    assert!(read.is_ok(), "no 100 Continue before the body was sent");
    assert!(String::from_utf8_lossy(&interim).starts_with("HTTP/1.1 100 Continue"));
    stream.write_all(&body).await.unwrap();
    let mut rest = vec![0u8; 512];
    let n = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut rest))
        .await
        .unwrap()
        .unwrap();
    assert!(String::from_utf8_lossy(&rest[..n]).contains("200 OK"));
    let received = up.received();
    assert_eq!(xxh3_128(&received[0].body), xxh3_128(&body));
    assert!(received[0].headers.get("expect").is_none());
}
