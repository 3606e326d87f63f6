//! W3C trace context in and out: a client's `traceparent`/`tracestate` read from its
//! headers, and the router's exchange span written into the backend's request (replacing
//! the client's, whose span is now the router's parent).

use opentelemetry::Context;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use pingora_http::RequestHeader;

/// The trace context a client sent, or an empty one. A `tracestate` sent over several
/// header lines is one list.
pub fn extract(headers: &http::HeaderMap) -> Context {
    let lines = headers
        .get_all(TRACESTATE)
        .iter()
        .filter_map(|v| v.to_str().ok());
    let lines: Vec<&str> = lines.collect();
    let tracestate = (lines.len() > 1).then(|| lines.join(","));
    TraceContextPropagator::new().extract(&Headers {
        map: headers,
        tracestate,
    })
}

/// Writes `cx`'s span into `head` as its `traceparent` (and `tracestate`).
pub fn inject(cx: &Context, head: &mut RequestHeader) {
    TraceContextPropagator::new().inject_context(cx, &mut UpstreamInjector(head));
}

const TRACESTATE: &str = "tracestate";

struct Headers<'h> {
    map: &'h http::HeaderMap,
    /// `tracestate`'s lines joined, when there are several.
    tracestate: Option<String>,
}

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        match &self.tracestate {
            Some(joined) if key == TRACESTATE => Some(joined),
            _ => self.map.get(key)?.to_str().ok(),
        }
    }

    fn keys(&self) -> Vec<&str> {
        self.map.keys().map(http::HeaderName::as_str).collect()
    }
}

struct UpstreamInjector<'h>(&'h mut RequestHeader);

impl Injector for UpstreamInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        // An empty tracestate is not sent (W3C): a new trace replaces the client's.
        if value.is_empty() {
            self.0.remove_header(key);
            return;
        }
        // Both names are valid header names, and the propagator writes printable values.
        let _ = self.0.insert_header(key.to_string(), value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::TraceContextExt;

    fn request() -> RequestHeader {
        RequestHeader::build("POST", b"/v1/completions", None).unwrap()
    }

    #[test]
    fn a_clients_context_is_read_and_passed_on() {
        let mut headers = http::HeaderMap::new();
        let parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        headers.insert("traceparent", parent.parse().unwrap());
        headers.insert("tracestate", "vendor=x".parse().unwrap());
        let cx = extract(&headers);
        let span = cx.span().span_context().clone();
        assert_eq!(
            span.trace_id().to_string(),
            "0af7651916cd43dd8448eb211c80319c"
        );
        assert!(span.is_sampled() && span.is_remote());
        let mut head = request();
        inject(&cx, &mut head);
        assert_eq!(head.headers["traceparent"], parent);
        assert_eq!(head.headers["tracestate"], "vendor=x");
    }

    #[test]
    fn a_malformed_context_starts_a_new_trace_and_sends_no_empty_state() {
        let mut headers = http::HeaderMap::new();
        headers.insert("traceparent", "00-zz-b7ad6b7169203331-01".parse().unwrap());
        headers.insert("tracestate", "vendor=x".parse().unwrap());
        let cx = extract(&headers);
        assert!(!cx.span().span_context().is_valid());
        let mut head = request();
        head.insert_header("tracestate", "vendor=x").unwrap();
        let parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        let new = extract(
            &[("traceparent".parse().unwrap(), parent.parse().unwrap())]
                .into_iter()
                .collect(),
        );
        inject(&new, &mut head);
        assert_eq!(head.headers["traceparent"], parent);
        assert!(!head.headers.contains_key("tracestate"));
    }

    #[test]
    fn a_tracestate_over_several_lines_is_one_list() {
        let mut headers = http::HeaderMap::new();
        let parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        headers.insert("traceparent", parent.parse().unwrap());
        headers.append("tracestate", "a=1".parse().unwrap());
        headers.append("tracestate", "b=2".parse().unwrap());
        let mut head = request();
        inject(&extract(&headers), &mut head);
        assert_eq!(head.headers["tracestate"], "a=1,b=2");
    }
}
