//! Headers on the way through: hop-by-hop headers are not forwarded in either direction, the
//! Host sent upstream is the backend's (a client cannot pick the upstream host), and
//! `Expect` is consumed here since the router answers `100 Continue` itself. Body framing
//! (Content-Length or chunked) is kept as the client sent it.

use http::header::{self, HeaderName};
use pingora_http::{RequestHeader, ResponseHeader};
use prefix_router_core::flow::Priority;

/// Hop-by-hop headers (RFC 9110 7.6.1) other than Transfer-Encoding, which frames the body.
const HOP_BY_HOP: [HeaderName; 6] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::TE,
    header::TRAILER,
    header::UPGRADE,
];

/// Header names the `Connection` header nominates as hop-by-hop.
fn nominated(headers: &http::HeaderMap) -> Vec<HeaderName> {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::try_from(name.trim()).ok())
        .collect()
}

/// The request to send upstream (without Host, set per backend by [`set_host`]).
pub fn upstream_request(client: &RequestHeader) -> RequestHeader {
    let mut req = client.clone();
    req.set_version(http::Version::HTTP_11);
    for name in nominated(&client.headers) {
        req.remove_header(&name);
    }
    for name in &HOP_BY_HOP {
        req.remove_header(name);
    }
    req.remove_header(&header::EXPECT);
    req
}

/// Points the request at `authority` (`host[:port]` of the backend).
pub fn set_host(req: &mut RequestHeader, authority: &str) {
    // An authority made from a validated worker URL is always a valid header value.
    if req.insert_header(header::HOST, authority).is_err() {
        req.remove_header(&header::HOST);
    }
}

/// The id of a request: the client's `x-request-id` when it is a short printable token,
/// else a new random one.
pub fn request_id(client: &RequestHeader) -> String {
    let given = client
        .headers
        .get(X_REQUEST_ID)
        .and_then(|v| v.to_str().ok());
    match given
        .filter(|v| !v.is_empty() && v.len() <= 128 && v.bytes().all(|b| b.is_ascii_graphic()))
    {
        Some(id) => id.to_string(),
        None => format!("{:032x}", fastrand::u128(..)),
    }
}

/// The header that carries a request's id to the backend and back to the client.
pub const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// The header that carries a request's priority to a vLLM engine (lower first), in place
/// of its body's `priority` field. vLLM schedules by it with `--scheduling-policy
/// priority` and ignores it otherwise; other engines ignore an unknown header.
pub const X_VLLM_PRIORITY: HeaderName = HeaderName::from_static("x-vllm-priority");

/// Carries `priority` to the engine ([`X_VLLM_PRIORITY`], [`Priority::vllm`]). Replaces
/// any the client sent.
pub fn set_engine_priority(req: &mut RequestHeader, priority: Priority) {
    // An integer's digits are always a valid header value.
    let _ = req.insert_header(X_VLLM_PRIORITY, priority.vllm().to_string());
}

/// The response to send the client.
pub fn client_response(upstream: &ResponseHeader) -> Box<ResponseHeader> {
    let mut resp = Box::new(upstream.clone());
    for name in nominated(&upstream.headers) {
        resp.remove_header(&name);
    }
    for name in &HOP_BY_HOP {
        resp.remove_header(name);
    }
    let framed = resp.headers.contains_key(header::CONTENT_LENGTH)
        || resp.headers.contains_key(header::TRANSFER_ENCODING);
    if !framed && may_have_body(resp.status.as_u16()) {
        // A close-delimited upstream body is sent chunked, so the client connection can stay.
        let _ = resp.insert_header(header::TRANSFER_ENCODING, "chunked");
    }
    resp
}

fn may_have_body(status: u16) -> bool {
    !(status < 200 || status == 204 || status == 304)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_loses_hop_by_hop_and_expect_but_keeps_framing() {
        let mut client = RequestHeader::build("POST", b"/v1/chat/completions", None).unwrap();
        for (k, v) in [
            ("connection", "keep-alive, x-private"),
            ("x-private", "1"),
            ("keep-alive", "timeout=5"),
            ("expect", "100-continue"),
            ("transfer-encoding", "chunked"),
            ("x-session-id", "s"),
        ] {
            client.append_header(k, v).unwrap();
        }
        let mut up = upstream_request(&client);
        set_host(&mut up, "10.0.0.1:8000");
        for gone in ["connection", "x-private", "keep-alive", "expect"] {
            assert!(up.headers.get(gone).is_none(), "{gone}");
        }
        assert_eq!(up.headers["transfer-encoding"], "chunked");
        assert_eq!(up.headers["x-session-id"], "s");
        assert_eq!(up.headers["host"], "10.0.0.1:8000");
    }

    #[test]
    fn the_engine_priority_replaces_the_clients() {
        let mut client = RequestHeader::build("POST", b"/v1/chat/completions", None).unwrap();
        client.append_header("x-vllm-priority", "-100").unwrap();
        let mut up = upstream_request(&client);
        for (priority, value) in [
            (Priority::High, "-1"),
            (Priority::Normal, "0"),
            (Priority::Low, "1"),
        ] {
            set_engine_priority(&mut up, priority);
            assert_eq!(
                up.headers
                    .get_all("x-vllm-priority")
                    .iter()
                    .collect::<Vec<_>>(),
                [value]
            );
        }
    }

    #[test]
    fn unframed_response_becomes_chunked() {
        let mut up = ResponseHeader::build(200, None).unwrap();
        up.append_header("connection", "close").unwrap();
        let resp = client_response(&up);
        assert!(resp.headers.get("connection").is_none());
        assert_eq!(resp.headers["transfer-encoding"], "chunked");
        let empty = client_response(&ResponseHeader::build(204, None).unwrap());
        assert!(empty.headers.get("transfer-encoding").is_none());
    }
}
