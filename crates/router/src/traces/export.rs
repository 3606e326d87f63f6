//! The span processor: finished, sampled spans go into a bounded queue without ever
//! waiting (a full queue drops the span and counts it), and one thread of its own sends
//! them to the collector in batches, with a timeout per request. A slow or dead collector
//! therefore costs requests nothing; its spans are counted as failed.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::time::{Duration, Instant};

use opentelemetry::Context;
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::{Span, SpanData, SpanExporter, SpanProcessor};
use parking_lot::Mutex;
use prometheus::IntCounter;

use super::TraceSettings;

/// Where spans are counted (`prefix_router_trace_spans_total{outcome}`).
#[derive(Clone, Debug)]
pub struct Counts {
    /// Accepted by the collector.
    pub exported: IntCounter,
    /// Dropped because the queue was full.
    pub queue_full: IntCounter,
    /// Dropped because the collector failed or did not answer in time.
    pub export_failed: IntCounter,
}

/// The processor, holding the queue's sending end (`None` asks the thread to stop).
#[derive(Debug)]
pub struct Batcher {
    queue: SyncSender<Option<SpanData>>,
    counts: Counts,
    stop: Arc<AtomicBool>,
    /// Receives once the exporting thread ended.
    done: Mutex<Option<Receiver<()>>>,
}

impl Batcher {
    /// Starts the exporting thread over `exporter`.
    pub fn start<E: SpanExporter + 'static>(
        exporter: E,
        settings: &TraceSettings,
        counts: Counts,
    ) -> std::io::Result<Batcher> {
        let (queue, spans) = std::sync::mpsc::sync_channel(settings.queue.max(1));
        let (finished, done) = std::sync::mpsc::sync_channel(1);
        let stop = Arc::new(AtomicBool::new(false));
        let worker = Worker {
            exporter,
            spans,
            stop: Arc::clone(&stop),
            counts: counts.clone(),
            batch: settings.batch.max(1),
            interval: settings.interval,
            timeout: settings.timeout,
        };
        std::thread::Builder::new()
            .name("otlp-export".into())
            .spawn(move || {
                worker.run();
                let _ = finished.send(());
            })?;
        Ok(Batcher {
            queue,
            counts,
            stop,
            done: Mutex::new(Some(done)),
        })
    }
}

impl SpanProcessor for Batcher {
    fn on_start(&self, _: &mut Span, _: &Context) {}

    fn on_end(&self, span: SpanData) {
        if !span.span_context.is_sampled() {
            return;
        }
        match self.queue.try_send(Some(span)) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => self.counts.queue_full.inc(),
            // The exporting thread is gone (stopped): the span cannot be exported.
            Err(TrySendError::Disconnected(_)) => self.counts.export_failed.inc(),
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.stop.store(true, Relaxed);
        // Wakes the thread if it waits for spans; a full queue keeps it busy anyway.
        let _ = self.queue.try_send(None);
        let Some(done) = self.done.lock().take() else {
            return Err(OTelSdkError::AlreadyShutdown);
        };
        done.recv_timeout(timeout)
            .map_err(|_| OTelSdkError::Timeout(timeout))
    }
}

/// The exporting thread's state.
struct Worker<E> {
    exporter: E,
    spans: Receiver<Option<SpanData>>,
    stop: Arc<AtomicBool>,
    counts: Counts,
    batch: usize,
    interval: Duration,
    timeout: Duration,
}

impl<E: SpanExporter> Worker<E> {
    /// Gathers batches (full, or as old as the interval) and exports each, until stopped;
    /// then exports what is left.
    fn run(self) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build();
        let runtime = match runtime {
            Ok(r) => r,
            Err(e) => return log::error!("traces: no runtime to export with: {e}"),
        };
        let mut failing = false;
        loop {
            let (batch, open) = self.gather();
            if !batch.is_empty() {
                failing = self.export(&runtime, batch, failing);
            }
            if !open || self.stop.load(Relaxed) {
                let rest: Vec<SpanData> = self.spans.try_iter().flatten().collect();
                if !rest.is_empty() {
                    self.export(&runtime, rest, failing);
                }
                return;
            }
        }
    }

    /// Spans until the batch is full or the interval passed; whether to go on (the queue is
    /// open and no stop was asked).
    fn gather(&self) -> (Vec<SpanData>, bool) {
        let mut batch = Vec::new();
        let deadline = Instant::now() + self.interval;
        while batch.len() < self.batch {
            let wait = deadline.saturating_duration_since(Instant::now());
            match self.spans.recv_timeout(wait) {
                Ok(Some(span)) => batch.push(span),
                Ok(None) => return (batch, false),
                Err(RecvTimeoutError::Timeout) => break,
                Err(RecvTimeoutError::Disconnected) => return (batch, false),
            }
        }
        (batch, true)
    }

    /// Sends one batch; returns whether it failed (a failure is logged when the previous
    /// batch succeeded, so a dead collector logs once).
    fn export(
        &self,
        runtime: &tokio::runtime::Runtime,
        batch: Vec<SpanData>,
        failing: bool,
    ) -> bool {
        let n = batch.len() as u64;
        let export = self.exporter.export(batch);
        let sent = runtime.block_on(async { tokio::time::timeout(self.timeout, export).await });
        let error = match sent {
            Ok(Ok(())) => {
                self.counts.exported.inc_by(n);
                return false;
            }
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("no answer within {:?}", self.timeout),
        };
        self.counts.export_failed.inc_by(n);
        if !failing {
            log::warn!("traces: {n} spans not exported: {error}");
        }
        true
    }
}
