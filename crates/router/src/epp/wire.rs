//! The ext_proc messages of the endpoint-picker protocol (Gateway API Inference Extension):
//! the request head as Envoy sends it, the gateway's subset hint, and the answers: the
//! chosen endpoint (a header Envoy's `ORIGINAL_DST` cluster forwards to, and the same in
//! `envoy.lb` dynamic metadata), bodies echoed in the full-duplex mode, and errors as
//! immediate responses in the OpenAI shape.

use std::net::SocketAddr;
use std::sync::Arc;

use envoy_types::pb::envoy::config::core::v3::header_value_option::HeaderAppendAction;
use envoy_types::pb::envoy::config::core::v3::{
    HeaderMap as Headers, HeaderValue, HeaderValueOption, Metadata,
};
use envoy_types::pb::envoy::service::ext_proc::v3::body_mutation::Mutation;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_response::Response;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    BodyMutation, BodyResponse, CommonResponse, HeaderMutation, HeadersResponse, ImmediateResponse,
    ProcessingResponse, StreamedBodyResponse, TrailersResponse,
};
use envoy_types::pb::envoy::r#type::v3::HttpStatus;
use envoy_types::pb::google::protobuf::{Struct, Value, value::Kind};
use http::{HeaderMap, HeaderName, Method};

use crate::error::RouterError;

/// The header (and `envoy.lb` metadata key) naming the chosen endpoint, `ip:port`.
pub const DESTINATION: &str = "x-gateway-destination-endpoint";

/// The metadata namespace of the gateway's subset hint.
const SUBSET_NAMESPACE: &str = "envoy.lb.subset_hint";

/// The key of the subset hint: a list of `ip:port` the request may go to.
const SUBSET_KEY: &str = "x-gateway-destination-endpoint-subset";

/// The metadata namespace the chosen endpoint is also published in.
const LB_NAMESPACE: &str = "envoy.lb";

/// Largest body piece echoed in one message, bytes: small messages, as Envoy's own
/// buffers take them.
const CHUNK: usize = 62_000;

/// A request's head as the gateway sent it.
pub struct Head {
    /// `:method`.
    pub method: Method,
    /// `:path` without its query.
    pub path: String,
    /// The other headers.
    pub headers: HeaderMap,
}

/// Reads a head from Envoy's `headers`: pseudo-headers apart, values from `raw_value`
/// (Envoy's current form) or `value`. A header that is not valid HTTP is refused.
pub fn head(headers: Option<&Headers>) -> Result<Head, RouterError> {
    let mut head = Head {
        method: Method::GET,
        path: "/".into(),
        headers: HeaderMap::new(),
    };
    let bad = |what: &str| RouterError::Malformed(format!("malformed request: {what}"));
    for header in headers.map_or(&[][..], |h| &h.headers) {
        let value = match header.raw_value.is_empty() {
            true => header.value.as_bytes(),
            false => &header.raw_value,
        };
        match header.key.as_str() {
            ":method" => head.method = Method::from_bytes(value).map_err(|_| bad("method"))?,
            ":path" => {
                let path = std::str::from_utf8(value).map_err(|_| bad("path"))?;
                head.path = path.split('?').next().unwrap_or(path).to_string();
            }
            pseudo if pseudo.starts_with(':') => {}
            name => {
                let name = HeaderName::from_bytes(name.as_bytes()).map_err(|_| bad("header"))?;
                let value = http::HeaderValue::from_bytes(value).map_err(|_| bad("header"))?;
                head.headers.append(name, value);
            }
        }
    }
    Ok(head)
}

/// The `ip:port` addresses the gateway's subset hint allows, if it gives one (an empty or
/// unreadable hint allows none).
pub fn subset(metadata: Option<&Metadata>) -> Option<Arc<[SocketAddr]>> {
    let hint = metadata?.filter_metadata.get(SUBSET_NAMESPACE)?;
    let list = match &hint.fields.get(SUBSET_KEY)?.kind {
        Some(Kind::ListValue(list)) => &list.values[..],
        _ => &[],
    };
    let addrs = list.iter().filter_map(|v| match &v.kind {
        Some(Kind::StringValue(s)) => s.parse().ok(),
        _ => None,
    });
    Some(addrs.collect())
}

/// Which of the request's phases an answer is for.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Phase {
    /// The request's headers.
    RequestHeaders,
    /// The request's body (its whole body, in the buffered mode).
    RequestBody,
}

/// The answer naming `addr` as the request's endpoint, in the `phase` the protocol asks,
/// with the request's `engine_priority` for the engine when it carries one.
pub fn destination(
    addr: SocketAddr,
    phase: Phase,
    engine_priority: Option<i64>,
) -> ProcessingResponse {
    let endpoint = addr.to_string();
    let mut set_headers = vec![header(DESTINATION, &endpoint)];
    if let Some(priority) = engine_priority {
        let name = crate::proxy::headers::X_VLLM_PRIORITY;
        set_headers.push(header(name.as_str(), &priority.to_string()));
    }
    let common = CommonResponse {
        header_mutation: Some(HeaderMutation {
            set_headers,
            remove_headers: Vec::new(),
        }),
        clear_route_cache: true,
        ..CommonResponse::default()
    };
    let string = |s: String| Value {
        kind: Some(Kind::StringValue(s)),
    };
    let lb = Struct {
        fields: [(DESTINATION.to_string(), string(endpoint))].into(),
    };
    let value = Value {
        kind: Some(Kind::StructValue(lb)),
    };
    let response = match phase {
        Phase::RequestHeaders => Response::RequestHeaders(HeadersResponse {
            response: Some(common),
        }),
        Phase::RequestBody => Response::RequestBody(BodyResponse {
            response: Some(common),
        }),
    };
    ProcessingResponse {
        dynamic_metadata: Some(Struct {
            fields: [(LB_NAMESPACE.to_string(), value)].into(),
        }),
        response: Some(response),
        ..ProcessingResponse::default()
    }
}

/// A header set to `value`, replacing any the client sent.
fn header(key: &str, value: &str) -> HeaderValueOption {
    HeaderValueOption {
        header: Some(HeaderValue {
            key: key.to_string(),
            raw_value: value.as_bytes().to_vec(),
            ..HeaderValue::default()
        }),
        append_action: HeaderAppendAction::OverwriteIfExistsOrAdd as i32,
        ..HeaderValueOption::default()
    }
}

/// Which way a body goes.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Side {
    /// The client's request.
    Request,
    /// The backend's response.
    Response,
}

/// `body` echoed back in the full-duplex mode, in pieces of at most [`CHUNK`] bytes; the
/// last one ends the stream when `last`.
pub fn echo(side: Side, body: &[u8], last: bool) -> impl Iterator<Item = ProcessingResponse> {
    let pieces = body.len().div_ceil(CHUNK).max(1);
    (0..pieces).map(move |i| {
        let piece = &body[(i * CHUNK).min(body.len())..((i + 1) * CHUNK).min(body.len())];
        let streamed = StreamedBodyResponse {
            body: piece.to_vec(),
            end_of_stream: last && i + 1 == pieces,
            ..StreamedBodyResponse::default()
        };
        let common = CommonResponse {
            body_mutation: Some(BodyMutation {
                mutation: Some(Mutation::StreamedResponse(streamed)),
            }),
            ..CommonResponse::default()
        };
        body_answer(side, Some(common))
    })
}

/// A body message let through as it is (the streamed and buffered modes).
pub fn body_continue(side: Side) -> ProcessingResponse {
    body_answer(side, None)
}

fn body_answer(side: Side, common: Option<CommonResponse>) -> ProcessingResponse {
    let answer = BodyResponse { response: common };
    let response = match side {
        Side::Request => Response::RequestBody(answer),
        Side::Response => Response::ResponseBody(answer),
    };
    answer_with(response)
}

/// Headers let through as they are.
pub fn headers_continue(side: Side) -> ProcessingResponse {
    let answer = HeadersResponse::default();
    answer_with(match side {
        Side::Request => Response::RequestHeaders(answer),
        Side::Response => Response::ResponseHeaders(answer),
    })
}

/// Trailers let through as they are.
pub fn trailers_continue(side: Side) -> ProcessingResponse {
    let answer = TrailersResponse::default();
    answer_with(match side {
        Side::Request => Response::RequestTrailers(answer),
        Side::Response => Response::ResponseTrailers(answer),
    })
}

fn answer_with(response: Response) -> ProcessingResponse {
    ProcessingResponse {
        response: Some(response),
        ..ProcessingResponse::default()
    }
}

/// `error` answered by the gateway itself, as the router answers it: its status, its
/// OpenAI-style JSON body, `Retry-After` and the rate-limit headers.
pub fn refusal(error: &RouterError) -> ProcessingResponse {
    let mut headers = error.headers();
    if let Some(secs) = error.retry_after() {
        headers.push(("retry-after".into(), secs.to_string()));
    }
    immediate(error.status(), &error.body(), headers, error.code())
}

/// A JSON `body` answered by the gateway itself with `status`.
pub fn json(status: u16, body: &serde_json::Value) -> ProcessingResponse {
    immediate(status, body.to_string().as_bytes(), Vec::new(), "answered")
}

fn immediate(
    status: u16,
    body: &[u8],
    headers: Vec<(String, String)>,
    details: &str,
) -> ProcessingResponse {
    let mut set = vec![
        header("content-type", "application/json"),
        header("cache-control", "no-store"),
    ];
    set.extend(headers.iter().map(|(k, v)| header(k, v)));
    answer_with(Response::ImmediateResponse(ImmediateResponse {
        status: Some(HttpStatus {
            code: i32::from(status),
        }),
        headers: Some(HeaderMutation {
            set_headers: set,
            remove_headers: Vec::new(),
        }),
        body: body.to_vec(),
        details: format!("prefix_router_{details}"),
        ..ImmediateResponse::default()
    }))
}

/// The response status Envoy reports in `headers` (`:status`), and whether the answer
/// asks to be retried later (`Retry-After`).
pub fn status(headers: Option<&Headers>) -> (u16, bool) {
    let mut status = 0;
    let mut retry_after = false;
    for header in headers.map_or(&[][..], |h| &h.headers) {
        let value = match header.raw_value.is_empty() {
            true => header.value.as_bytes(),
            false => &header.raw_value,
        };
        match header.key.as_str() {
            ":status" => {
                let text = std::str::from_utf8(value).ok();
                status = text.and_then(|s| s.parse().ok()).unwrap_or(0);
            }
            "retry-after" => retry_after = true,
            _ => {}
        }
    }
    (status, retry_after)
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::google::protobuf::ListValue;

    fn headers(pairs: &[(&str, &str)]) -> Headers {
        let headers = pairs.iter().map(|(k, v)| HeaderValue {
            key: k.to_string(),
            raw_value: v.as_bytes().to_vec(),
            ..HeaderValue::default()
        });
        Headers {
            headers: headers.collect(),
        }
    }

    #[test]
    fn a_head_keeps_its_method_path_and_headers_apart() {
        let sent = headers(&[
            (":method", "POST"),
            (":path", "/v1/chat/completions?x=1"),
            (":authority", "gw"),
            ("x-session-id", "s1"),
        ]);
        let head = head(Some(&sent)).unwrap();
        assert_eq!(head.method, Method::POST);
        assert_eq!(head.path, "/v1/chat/completions");
        assert_eq!(head.headers.len(), 1);
        assert_eq!(head.headers["x-session-id"], "s1");
        let bad = headers(&[("bad header", "v")]);
        assert_eq!(head_error(&bad), 400);
    }

    fn head_error(h: &Headers) -> u16 {
        head(Some(h)).err().map_or(0, |e| e.status())
    }

    #[test]
    fn a_subset_hint_lists_addresses_and_an_empty_one_allows_none() {
        let string = |s: &str| Value {
            kind: Some(Kind::StringValue(s.into())),
        };
        let hint = |values: Vec<Value>| {
            let list = Value {
                kind: Some(Kind::ListValue(ListValue { values })),
            };
            let hint = Struct {
                fields: [(SUBSET_KEY.to_string(), list)].into(),
            };
            Metadata {
                filter_metadata: [(SUBSET_NAMESPACE.to_string(), hint)].into(),
                ..Metadata::default()
            }
        };
        let two = hint(vec![string("10.0.0.1:8000"), string("not an address")]);
        let addrs = subset(Some(&two)).unwrap();
        assert_eq!(&addrs[..], &["10.0.0.1:8000".parse().unwrap()]);
        assert_eq!(subset(Some(&hint(vec![]))).unwrap().len(), 0);
        assert!(subset(Some(&Metadata::default())).is_none());
        assert!(subset(None).is_none());
    }

    #[test]
    fn an_echo_is_cut_in_pieces_and_only_the_last_ends_the_stream() {
        let body = vec![7u8; CHUNK * 2 + 5];
        let pieces: Vec<_> = echo(Side::Request, &body, true).collect();
        assert_eq!(pieces.len(), 3);
        let streamed = |p: &ProcessingResponse| match &p.response {
            Some(Response::RequestBody(BodyResponse {
                response:
                    Some(CommonResponse {
                        body_mutation:
                            Some(BodyMutation {
                                mutation: Some(Mutation::StreamedResponse(s)),
                            }),
                        ..
                    }),
            })) => (s.body.len(), s.end_of_stream),
            _ => panic!("not a streamed body"),
        };
        let seen: Vec<_> = pieces.iter().map(streamed).collect();
        assert_eq!(seen, vec![(CHUNK, false), (CHUNK, false), (5, true)]);
        let empty: Vec<_> = echo(Side::Request, &[], true).collect();
        assert_eq!(empty.iter().map(streamed).collect::<Vec<_>>(), [(0, true)]);
    }

    #[test]
    fn the_destination_is_a_header_and_lb_metadata() {
        let addr: SocketAddr = "127.0.0.1:8000".parse().unwrap();
        let answer = destination(addr, Phase::RequestHeaders, None);
        let Some(Response::RequestHeaders(h)) = &answer.response else {
            panic!("not a headers answer");
        };
        let common = h.response.as_ref().unwrap();
        assert!(common.clear_route_cache);
        let set = &common.header_mutation.as_ref().unwrap().set_headers[0];
        let header = set.header.as_ref().unwrap();
        assert_eq!(
            (header.key.as_str(), &header.raw_value[..]),
            (DESTINATION, &b"127.0.0.1:8000"[..])
        );
        let lb = &answer.dynamic_metadata.as_ref().unwrap().fields[LB_NAMESPACE];
        let Some(Kind::StructValue(lb)) = &lb.kind else {
            panic!("no envoy.lb struct");
        };
        let Some(Kind::StringValue(named)) = &lb.fields[DESTINATION].kind else {
            panic!("no endpoint in envoy.lb");
        };
        assert_eq!(named, "127.0.0.1:8000");
    }

    #[test]
    fn statuses_are_read_from_pseudo_headers() {
        assert_eq!(
            status(Some(&headers(&[(":status", "503"), ("retry-after", "1")]))),
            (503, true)
        );
        assert_eq!(status(Some(&headers(&[(":status", "200")]))), (200, false));
        assert_eq!(status(None), (0, false));
    }
}
