//! The router as the endpoint picker (EPP) of an Envoy gateway, as the Gateway API
//! Inference Extension defines it: Envoy's `ext_proc` filter streams each request's head and
//! body here over gRPC, the router places the request as its own data plane would (same
//! parse, index, ledger, policies, tenants and queue), and answers the chosen backend's
//! `ip:port` in the `x-gateway-destination-endpoint` header and `envoy.lb` metadata, which
//! an `ORIGINAL_DST` cluster forwards to. Envoy carries the bytes; the router only reads
//! them. The response's status and usage are read as Envoy passes them through, when it is
//! configured to send them, so the index's calibration and the stats work as behind the
//! data plane.
//!
//! gRPC health (`grpc.health.v1`): the empty service name and `liveness` are serving while
//! the process runs; `readiness` and the ext_proc service's name are serving while a
//! backend is ready and the router is not draining.
//!
//! The gRPC port serves TLS (HTTP/2 by ALPN) with the data listener's certificate when
//! `tls_cert_file` is set, reloaded as the router's is ([`listen`]).
//!
//! It runs as a Pingora background service in place of the HTTP data plane, so that the
//! admin listener, health checks, metrics reading, upkeep and reloads are the router's own.

mod listen;
mod stream;
mod wire;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_server::{
    ExternalProcessor, ExternalProcessorServer,
};
use envoy_types::pb::envoy::service::ext_proc::v3::{ProcessingRequest, ProcessingResponse};
use log::{error, info};
use pingora_core::server::ShutdownWatch;
use pingora_core::services::background::BackgroundService;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

use crate::state::State;
use crate::tls::Certificate;

/// The ext_proc service's name, as health checks ask for it.
const SERVICE: &str = "envoy.service.ext_proc.v3.ExternalProcessor";

/// Messages queued towards the gateway per stream before the picker waits for it.
const OUTBOUND: usize = 16;

/// Largest message taken from the gateway, bytes: a whole body in the buffered mode.
const MAX_MESSAGE: usize = 256 << 20;

/// HTTP/2 flow-control window of each stream and of the connection, bytes: a large body
/// streams in without waiting for window updates.
const WINDOW: u32 = 8 << 20;

/// How often readiness is read again for the health service.
const HEALTH_INTERVAL: Duration = Duration::from_millis(500);

/// The endpoint picker's gRPC server, on `listen`.
pub struct Epp {
    state: Arc<State>,
    listen: String,
    certificate: Option<Arc<Certificate>>,
}

impl Epp {
    /// A picker over `state`, serving on `listen` (`host:port`), over TLS with
    /// `certificate` when there is one.
    pub fn new(state: Arc<State>, listen: String, certificate: Option<Arc<Certificate>>) -> Self {
        Epp {
            state,
            listen,
            certificate,
        }
    }
}

#[async_trait]
impl BackgroundService for Epp {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let listener = match tokio::net::TcpListener::bind(&self.listen).await {
            Ok(listener) => listener,
            Err(e) => return error!("endpoint picker: cannot listen on {}: {e}", self.listen),
        };
        let tls = match self.certificate {
            Some(_) => " over TLS",
            None => "",
        };
        let (reporter, health) = tonic_health::server::health_reporter();
        let processor = ExternalProcessorServer::new(Processor {
            state: Arc::clone(&self.state),
        })
        .max_decoding_message_size(MAX_MESSAGE);
        let watching = tokio::spawn(report(Arc::clone(&self.state), reporter));
        info!("endpoint picker: ext_proc gRPC{tls} on {}", self.listen);
        let incoming = listen::incoming(listener, self.certificate.clone());
        let served = tonic::transport::Server::builder()
            .initial_stream_window_size(WINDOW)
            .initial_connection_window_size(WINDOW)
            .add_service(health)
            .add_service(processor)
            .serve_with_incoming_shutdown(incoming, async move {
                let _ = shutdown.changed().await;
            })
            .await;
        watching.abort();
        if let Err(e) = served {
            error!(
                "endpoint picker: gRPC server on {} failed: {e}",
                self.listen
            );
        }
    }
}

/// Keeps the health service's statuses in step with the fleet and the drain.
async fn report(state: Arc<State>, reporter: HealthReporter) {
    reporter
        .set_service_status("liveness", ServingStatus::Serving)
        .await;
    let mut last = None;
    loop {
        let ready = !state.draining() && !state.fleet.ready(&[]).is_empty();
        if last != Some(ready) {
            let status = match ready {
                true => ServingStatus::Serving,
                false => ServingStatus::NotServing,
            };
            for service in ["readiness", SERVICE] {
                reporter.set_service_status(service, status).await;
            }
            last = Some(ready);
        }
        tokio::time::sleep(HEALTH_INTERVAL).await;
    }
}

/// The ext_proc service: one task per stream.
struct Processor {
    state: Arc<State>,
}

#[async_trait]
impl ExternalProcessor for Processor {
    type ProcessStream = ReceiverStream<Result<ProcessingResponse, Status>>;

    async fn process(
        &self,
        request: Request<Streaming<ProcessingRequest>>,
    ) -> Result<Response<Self::ProcessStream>, Status> {
        let (out, answers) = tokio::sync::mpsc::channel(OUTBOUND);
        let state = Arc::clone(&self.state);
        tokio::spawn(stream::serve(state, request.into_inner(), out));
        Ok(Response::new(ReceiverStream::new(answers)))
    }
}
