//! One request's spans. The server span starts with the request and ends in the access
//! log's phase. Under it: `read body` and `wait` (a wait for a backend, under `route`) are
//! made when their step ends, with the step's own start time; `route` (from the parsed body
//! to the first placement) and one `upstream` client span per attempt, whose context the
//! backend receives, are open while theirs runs. Without tracing every call is a no-op.

use std::time::{Duration, SystemTime};

use opentelemetry::trace::{Span as _, SpanKind, Status, TraceContextExt, Tracer as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::Tracer;
use parking_lot::Mutex;
use pingora_http::RequestHeader;

use super::context;
use crate::error::RouterError;

/// What a finished request tells its server span.
pub struct Ending<'e> {
    /// The status sent to the client (0: none).
    pub status: u16,
    /// Why the router failed the request, if it did.
    pub error: Option<&'e RouterError>,
    /// The backend that answered or was tried last (`host:port`).
    pub backend: Option<&'e str>,
    /// Attempts retried on another backend.
    pub retries: usize,
}

/// A request's trace; empty (all no-ops) without tracing.
#[derive(Default)]
pub struct RequestTrace {
    live: Option<LiveTrace>,
}

struct LiveTrace {
    tracer: Tracer,
    /// The context holding the server span.
    server: Context,
    /// The context holding the `route` span while it is open.
    route: Mutex<Option<Context>>,
}

impl RequestTrace {
    /// Starts the server span at `started`, under the context in `headers` if any.
    pub fn start(tracer: &Tracer, headers: &http::HeaderMap, started: SystemTime) -> Self {
        let parent = context::extract(headers);
        let span = tracer
            .span_builder("request")
            .with_kind(SpanKind::Server)
            .with_start_time(started)
            .start_with_context(tracer, &parent);
        RequestTrace {
            live: Some(LiveTrace {
                tracer: tracer.clone(),
                server: parent.with_span(span),
                route: Mutex::new(None),
            }),
        }
    }

    /// The live trace when its spans are recorded (sampled).
    fn recording(&self) -> Option<&LiveTrace> {
        self.live
            .as_ref()
            .filter(|l| l.server.span().is_recording())
    }

    /// Names the server span after its method and `route` (a routed endpoint's path; other
    /// paths are not in the name, which must stay of few values) and records its path.
    pub fn request_line(&self, method: &str, route: Option<&str>, path: &str, request_id: &str) {
        let Some(live) = self.recording() else { return };
        let span = live.server.span();
        span.update_name(match route {
            Some(route) => format!("{method} {route}"),
            None => method.to_string(),
        });
        if let Some(route) = route {
            span.set_attribute(KeyValue::new("http.route", route.to_string()));
        }
        span.set_attributes([
            KeyValue::new("http.request.method", method.to_string()),
            KeyValue::new("url.path", path.to_string()),
            KeyValue::new("prefix_router.request_id", request_id.to_string()),
        ]);
    }

    /// The body was read, from `started` to now.
    pub fn body_read(&self, started: SystemTime, read: Result<usize, &RouterError>) {
        let Some(live) = self.recording() else { return };
        let mut span = live.child(&live.server, "read body", started, Vec::new());
        match read {
            Ok(bytes) => span.set_attribute(KeyValue::new("http.request.body.size", bytes as i64)),
            Err(error) => span.set_status(Status::error(error.to_string())),
        }
        span.end();
    }

    /// Routing starts: parsing the body, then placing it.
    pub fn routing(&self) {
        let Some(live) = self.recording() else { return };
        let span = live.child(&live.server, "route", SystemTime::now(), Vec::new());
        *live.route.lock() = Some(live.server.with_span(span));
    }

    /// The request waited for a backend from `started` to now.
    pub fn waited(&self, started: SystemTime) {
        let Some(live) = self.recording() else { return };
        let route = live.route.lock();
        let parent = route.as_ref().unwrap_or(&live.server);
        live.child(parent, "wait", started, Vec::new()).end();
    }

    /// The request was first placed, as `attributes` say: the route span ends.
    pub fn placed(&self, attributes: impl FnOnce() -> Vec<KeyValue>) {
        let Some(live) = self.recording() else { return };
        if let Some(route) = live.route.lock().take() {
            let span = route.span();
            span.set_attributes(attributes());
            span.end();
        }
    }

    /// How a disaggregated request went (`split` or `local`), on its server span.
    pub fn disaggregated(&self, way: &'static str) {
        let Some(live) = self.recording() else { return };
        (live.server.span()).set_attribute(KeyValue::new("prefix_router.disaggregation", way));
    }

    /// A client span for one attempt on `backend` (`host:port`), for the leg it carries
    /// (`None`: the whole request).
    pub fn exchange(&self, backend: &str, leg: Option<&'static str>) -> ExchangeSpan {
        let Some(live) = &self.live else {
            return ExchangeSpan::default();
        };
        let (host, port) = backend.rsplit_once(':').unwrap_or((backend, ""));
        let mut attributes = vec![
            KeyValue::new("server.address", host.to_string()),
            KeyValue::new("prefix_router.backend", backend.to_string()),
        ];
        if let Ok(port) = port.parse::<i64>() {
            attributes.push(KeyValue::new("server.port", port));
        }
        if let Some(leg) = leg {
            attributes.push(KeyValue::new("prefix_router.leg", leg));
        }
        let span = (live.tracer.span_builder("upstream"))
            .with_kind(SpanKind::Client)
            .with_attributes(attributes)
            .start_with_context(&live.tracer, &live.server);
        ExchangeSpan {
            cx: Some(live.server.with_span(span)),
        }
    }

    /// Ends the server span.
    pub fn end(&self, ending: Ending) {
        let Some(live) = &self.live else { return };
        let span = live.server.span();
        if span.is_recording() {
            if let Some(route) = live.route.lock().take() {
                route.span().end();
            }
            let mut attributes = vec![KeyValue::new(
                "prefix_router.retries",
                ending.retries as i64,
            )];
            if ending.status > 0 {
                attributes.push(KeyValue::new(
                    "http.response.status_code",
                    i64::from(ending.status),
                ));
            }
            if let Some(backend) = ending.backend {
                attributes.push(KeyValue::new("prefix_router.backend", backend.to_string()));
            }
            span.set_attributes(attributes);
            // A server's span is in error for 5xx (or no answer), not for the client's 4xx.
            if let Some(error) = ending.error {
                span.set_attribute(KeyValue::new("error.type", error.code()));
                if ending.status == 0 || ending.status >= 500 {
                    span.set_status(Status::error(error.to_string()));
                }
            } else if ending.status >= 500 {
                span.set_status(Status::error(format!("status {}", ending.status)));
            }
        }
        span.end();
    }
}

impl LiveTrace {
    /// A span under `parent` from `started`, still open.
    fn child(
        &self,
        parent: &Context,
        name: &'static str,
        started: SystemTime,
        attributes: Vec<KeyValue>,
    ) -> opentelemetry_sdk::trace::Span {
        (self.tracer.span_builder(name))
            .with_start_time(started)
            .with_attributes(attributes)
            .start_with_context(&self.tracer, parent)
    }
}

/// What one exchange's span records when it ends.
#[derive(Default)]
pub struct ExchangeEnd<'e> {
    /// The backend's response status (0: none arrived).
    pub status: u16,
    /// From sending the request to the first response body byte.
    pub first_byte: Option<Duration>,
    /// Prompt and cached tokens from the response's usage.
    pub usage: Option<(u64, u64)>,
    /// Why the exchange failed, if it did.
    pub error: Option<&'e RouterError>,
}

/// One attempt's client span; empty without tracing.
#[derive(Default)]
pub struct ExchangeSpan {
    cx: Option<Context>,
}

impl ExchangeSpan {
    /// Writes this span into the backend's request as its parent.
    pub fn inject(&self, head: &mut RequestHeader) {
        if let Some(cx) = &self.cx {
            context::inject(cx, head);
        }
    }

    /// Ends the span with what was seen.
    pub fn end(self, end: ExchangeEnd) {
        let Some(cx) = self.cx else { return };
        let span = cx.span();
        if span.is_recording() {
            let mut attributes = Vec::with_capacity(4);
            if end.status > 0 {
                attributes.push(KeyValue::new(
                    "http.response.status_code",
                    i64::from(end.status),
                ));
            }
            if let Some(t) = end.first_byte {
                let ms = t.as_secs_f64() * 1000.0;
                attributes.push(KeyValue::new("prefix_router.time_to_first_byte_ms", ms));
            }
            if let Some((prompt, cached)) = end.usage {
                attributes.push(KeyValue::new("gen_ai.usage.input_tokens", prompt as i64));
                attributes.push(KeyValue::new("prefix_router.cached_tokens", cached as i64));
            }
            span.set_attributes(attributes);
            // A client's span is in error for any 4xx or 5xx answer, or none.
            match end.error {
                Some(error) => span.set_status(Status::error(error.to_string())),
                None if end.status >= 400 => {
                    span.set_status(Status::error(format!("status {}", end.status)));
                }
                None => {}
            }
        }
        span.end();
    }
}
