//! The span processor: finished, sampled spans go into a bounded queue without ever
//! waiting (a full queue drops the span and counts it), and one thread of its own sends
//! them to the collector in batches, with a timeout per request. A slow or dead collector
//! therefore costs requests nothing; its spans are counted as failed.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::mpsc::{Receiver, SyncSender, TryRecvError, TrySendError};
use std::time::{Duration, Instant};

use opentelemetry::Context;
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::{Span, SpanData, SpanExporter, SpanProcessor};
use parking_lot::Mutex;
use prometheus::IntCounter;

use super::TraceSettings;
use crate::stats::{Registry, label_set};

/// How often the exporting thread looks at the queue. It polls rather than waits on the
/// queue, so that a finished span never has to wake it (a futex wake per span cost a request
/// thread more than the span itself).
const TICK: Duration = Duration::from_millis(20);

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

label_set! {
    /// What became of a finished span.
    enum SpanOutcome {
        Exported => "exported",
        QueueFull => "queue_full",
        ExportFailed => "export_failed",
    }
}

impl Counts {
    /// Registers the counts in `registry`.
    pub fn new(registry: &Registry) -> Self {
        let spans = registry.counters::<SpanOutcome>(
            "trace_spans_total",
            "Finished sampled spans: exported, dropped from a full queue, or failed to \
             export (collector error or timeout)",
            "outcome",
        );
        Counts {
            exported: spans.of(SpanOutcome::Exported),
            queue_full: spans.of(SpanOutcome::QueueFull),
            export_failed: spans.of(SpanOutcome::ExportFailed),
        }
    }
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
        let worker = ExportWorker {
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
struct ExportWorker<E> {
    exporter: E,
    spans: Receiver<Option<SpanData>>,
    stop: Arc<AtomicBool>,
    counts: Counts,
    batch: usize,
    interval: Duration,
    timeout: Duration,
}

impl<E: SpanExporter> ExportWorker<E> {
    /// Takes what is queued every [`TICK`] and exports a batch once it is full or its first
    /// span is as old as the interval, until stopped; then exports what is left.
    fn run(self) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build();
        let runtime = match runtime {
            Ok(r) => r,
            Err(e) => return log::error!("traces: no runtime to export with: {e}"),
        };
        let (mut failing, mut batch, mut since) = (false, Vec::new(), Instant::now());
        loop {
            let empty = batch.is_empty();
            let open = self.fill(&mut batch) && !self.stop.load(Relaxed);
            if empty && !batch.is_empty() {
                since = Instant::now();
            }
            let full = batch.len() >= self.batch;
            if full || !open || (!batch.is_empty() && since.elapsed() >= self.interval) {
                let taken = std::mem::take(&mut batch);
                if !taken.is_empty() {
                    failing = self.export(&runtime, taken, failing);
                }
            }
            if !open {
                let rest: Vec<SpanData> = self.spans.try_iter().flatten().collect();
                if !rest.is_empty() {
                    self.export(&runtime, rest, failing);
                }
                return;
            }
            if !full {
                std::thread::sleep(TICK);
            }
        }
    }

    /// Adds queued spans to `batch` until it is full or the queue empty; whether to go on
    /// (the queue is open and no stop was asked).
    fn fill(&self, batch: &mut Vec<SpanData>) -> bool {
        while batch.len() < self.batch {
            match self.spans.try_recv() {
                Ok(Some(span)) => batch.push(span),
                Ok(None) | Err(TryRecvError::Disconnected) => return false,
                Err(TryRecvError::Empty) => return true,
            }
        }
        true
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
