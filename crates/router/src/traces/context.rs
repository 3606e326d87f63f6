//! W3C trace context in and out: a client's `traceparent`/`tracestate` read from its
//! headers, and the router's exchange span written into the backend's request (replacing
//! the client's, whose span is now the router's parent).

use opentelemetry::Context;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use pingora_http::RequestHeader;

/// The trace context a client sent, or an empty one.
pub fn extract(headers: &http::HeaderMap) -> Context {
    TraceContextPropagator::new().extract(&Headers(headers))
}

/// Writes `cx`'s span into `head` as its `traceparent` (and `tracestate`).
pub fn inject(cx: &Context, head: &mut RequestHeader) {
    TraceContextPropagator::new().inject_context(cx, &mut Upstream(head));
}

struct Headers<'h>(&'h http::HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key)?.to_str().ok()
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(http::HeaderName::as_str).collect()
    }
}

struct Upstream<'h>(&'h mut RequestHeader);

impl Injector for Upstream<'_> {
    fn set(&mut self, key: &str, value: String) {
        // Both names are valid header names, and the propagator writes printable values.
        let _ = self.0.insert_header(key.to_string(), value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::TraceContextExt;

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
        let mut head = RequestHeader::build("POST", b"/v1/completions", None).unwrap();
        inject(&cx, &mut head);
        assert_eq!(head.headers["traceparent"], parent);
        assert_eq!(head.headers["tracestate"], "vendor=x");
    }

    #[test]
    fn a_malformed_context_starts_a_new_trace() {
        let mut headers = http::HeaderMap::new();
        headers.insert("traceparent", "00-zz-b7ad6b7169203331-01".parse().unwrap());
        assert!(!extract(&headers).span().span_context().is_valid());
    }
}
