//! OpenTelemetry traces, off by default. Each request gets a server span with children:
//! reading the body, routing (with any wait for a backend under it), and one client span per
//! upstream exchange ([`RequestTrace`]). A client's W3C `traceparent`/`tracestate` is
//! continued and the backend receives the exchange span as its parent ([`context`]).
//! Finished spans leave through a bounded queue that a request never waits on, and are
//! exported over OTLP/HTTP (protobuf) in batches ([`export`]); what is dropped is counted.

mod context;
mod export;
mod request;

use std::time::Duration;

use opentelemetry::KeyValue;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};

pub use export::Counts;
pub use request::{Ending, ExchangeEnd, ExchangeSpan, RequestTrace};

/// How the router exports traces.
#[derive(Clone, Debug, PartialEq)]
pub struct TraceSettings {
    /// The collector's OTLP/HTTP URL (`otlp_endpoint`): a base such as
    /// `http://collector:4318` gets `/v1/traces` appended, a URL with a path is used as is.
    /// Default none: `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or `OTEL_EXPORTER_OTLP_ENDPOINT`
    /// when set, else no export and no spans.
    pub endpoint: Option<String>,
    /// Fraction of new traces sampled, 0..=1 (`trace_sample_ratio`); a client's parent
    /// decides for its trace. Default `OTEL_TRACES_SAMPLER_ARG`, else 1.
    pub sample_ratio: Option<f64>,
    /// `service.name` (`trace_service_name`). Default `OTEL_SERVICE_NAME`, else
    /// `prefix-router`.
    pub service_name: Option<String>,
    /// More resource attributes (`trace_resource_attributes`, `key=value`), added to
    /// `OTEL_RESOURCE_ATTRIBUTES`'s. Default none.
    pub resource: Vec<(String, String)>,
    /// Finished spans waiting for export at most (`trace_queue_size`); more are dropped.
    /// Default 2048.
    pub queue: usize,
    /// Spans per export request at most. Default 512.
    pub batch: usize,
    /// Longest time a finished span waits for its batch. Default 1 s.
    pub interval: Duration,
    /// Time one export request may take. Default `OTEL_EXPORTER_OTLP_TRACES_TIMEOUT` or
    /// `OTEL_EXPORTER_OTLP_TIMEOUT` (milliseconds), else 10 s.
    pub timeout: Duration,
}

impl Default for TraceSettings {
    fn default() -> Self {
        TraceSettings {
            endpoint: None,
            sample_ratio: None,
            service_name: None,
            resource: Vec::new(),
            queue: 2048,
            batch: 512,
            interval: Duration::from_secs(1),
            timeout: Duration::from_secs(10),
        }
    }
}

impl TraceSettings {
    /// Whether spans are made and exported: an endpoint is set here or in the environment,
    /// and `OTEL_SDK_DISABLED` is not `true`.
    pub fn enabled(&self) -> bool {
        let env = |name| std::env::var(name).is_ok_and(|v: String| !v.trim().is_empty());
        let disabled =
            std::env::var("OTEL_SDK_DISABLED").is_ok_and(|v| v.eq_ignore_ascii_case("true"));
        let endpoint = self.endpoint.is_some()
            || env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
            || env("OTEL_EXPORTER_OTLP_ENDPOINT");
        endpoint && !disabled
    }

    /// The sampling ratio: this setting, else `OTEL_TRACES_SAMPLER_ARG`, else 1.
    fn ratio(&self) -> f64 {
        let env = std::env::var("OTEL_TRACES_SAMPLER_ARG").ok();
        let env = env.and_then(|v| v.trim().parse::<f64>().ok());
        let ratio = self.sample_ratio.or(env).unwrap_or(1.0);
        if ratio.is_finite() {
            ratio.clamp(0.0, 1.0)
        } else {
            1.0
        }
    }

    /// These settings with the export timeout the environment sets, if any.
    fn with_env_timeout(&self) -> TraceSettings {
        let ms = [
            "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
            "OTEL_EXPORTER_OTLP_TIMEOUT",
        ]
        .iter()
        .find_map(|name| std::env::var(name).ok()?.trim().parse::<u64>().ok());
        TraceSettings {
            timeout: ms.map_or(self.timeout, Duration::from_millis),
            ..self.clone()
        }
    }

    /// The export URL of `endpoint`: `/v1/traces` appended to a base without a path.
    fn url(endpoint: &str) -> String {
        let rest = endpoint
            .split_once("://")
            .map_or(endpoint, |(_, rest)| rest);
        match rest.split_once('/') {
            Some((_, path)) if !path.is_empty() => endpoint.to_string(),
            _ => format!("{}/v1/traces", endpoint.trim_end_matches('/')),
        }
    }

    fn resource(&self) -> Resource {
        let mut builder = Resource::builder();
        let named_in_env = std::env::var("OTEL_SERVICE_NAME").is_ok();
        match &self.service_name {
            Some(name) => builder = builder.with_service_name(name.clone()),
            None if !named_in_env => builder = builder.with_service_name("prefix-router"),
            None => {}
        }
        let extra = self
            .resource
            .iter()
            .map(|(k, v)| KeyValue::new(k.clone(), v.clone()));
        builder.with_attributes(extra).build()
    }
}

/// Why traces cannot be exported as configured.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// The exporter could not be built (a bad endpoint, say).
    #[error("cannot export traces: {0}")]
    Exporter(String),
}

/// The router's tracer: makes each request's spans when enabled, nothing otherwise.
#[derive(Default)]
pub struct Tracing {
    provider: Option<(SdkTracerProvider, opentelemetry_sdk::trace::Tracer)>,
    /// Longest wait for the last export at shutdown.
    flush: Duration,
    shut: std::sync::OnceLock<()>,
}

impl Tracing {
    /// Off: no span is made, headers pass as they came.
    pub fn off() -> Tracing {
        Tracing::default()
    }

    /// Starts exporting as `settings` say (off when [`TraceSettings::enabled`] is not),
    /// counting spans in `counts`.
    pub fn start(settings: &TraceSettings, counts: Counts) -> Result<Tracing, TraceError> {
        if !settings.enabled() {
            return Ok(Tracing::off());
        }
        let settings = &settings.with_env_timeout();
        let endpoint = (settings.endpoint.clone())
            .or_else(|| std::env::var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").ok())
            .or_else(|| std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT").ok());
        if endpoint.is_some_and(|e| !e.trim().starts_with("http://")) {
            let reason = "the collector must be an http:// URL (no TLS to collectors)";
            return Err(TraceError::Exporter(reason.into()));
        }
        let client = reqwest::Client::builder()
            .timeout(settings.timeout)
            .build()
            .map_err(|e| TraceError::Exporter(e.to_string()))?;
        let mut exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .with_http_client(client)
            .with_timeout(settings.timeout);
        if let Some(endpoint) = &settings.endpoint {
            exporter = exporter.with_endpoint(TraceSettings::url(endpoint));
        }
        let mut exporter = exporter
            .build()
            .map_err(|e| TraceError::Exporter(e.to_string()))?;
        let resource = settings.resource();
        opentelemetry_sdk::trace::SpanExporter::set_resource(&mut exporter, &resource);
        let batcher = export::Batcher::start(exporter, settings, counts)
            .map_err(|e| TraceError::Exporter(e.to_string()))?;
        let sampler = Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(settings.ratio())));
        let provider = SdkTracerProvider::builder()
            .with_span_processor(batcher)
            .with_sampler(sampler)
            .with_resource(resource)
            .build();
        let tracer = provider.tracer("prefix-router");
        Ok(Tracing {
            provider: Some((provider, tracer)),
            flush: settings.timeout + Duration::from_secs(2),
            shut: std::sync::OnceLock::new(),
        })
    }

    /// A request's trace, continuing the context in its `headers`, from `started`.
    pub fn request(
        &self,
        headers: &http::HeaderMap,
        started: std::time::SystemTime,
    ) -> RequestTrace {
        match &self.provider {
            Some((_, tracer)) => RequestTrace::start(tracer, headers, started),
            None => RequestTrace::default(),
        }
    }

    /// Exports what is queued (within the export timeout) and stops. Later and concurrent
    /// calls return once the first is done.
    pub fn shutdown(&self) {
        let Some((provider, _)) = &self.provider else {
            return;
        };
        self.shut.get_or_init(|| {
            if let Err(e) = provider.shutdown_with_timeout(self.flush) {
                log::warn!("traces: {e}");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_base_endpoint_gets_the_traces_path() {
        let url = TraceSettings::url;
        assert_eq!(url("http://c:4318"), "http://c:4318/v1/traces");
        assert_eq!(url("http://c:4318/"), "http://c:4318/v1/traces");
        assert_eq!(
            url("http://c:4318/otlp/v1/traces"),
            "http://c:4318/otlp/v1/traces"
        );
    }
}
