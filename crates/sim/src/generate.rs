//! The generation endpoints (`/v1/chat/completions`, `/v1/completions`,
//! `/v1/responses`): validate, hand the request to the engine, answer when it says so.
//!
//! For: the request lifecycle on the HTTP side. Non-streaming responses are sent
//! when the engine finishes the request. Streaming responses send their headers at
//! once, the first content at the engine's first-token time, then the output text
//! on the simulated decode schedule, coalesced to at most one event per
//! [`MIN_EVENT_INTERVAL`] of real time, and last the usage. A client that goes away
//! aborts its request in the engine (its blocks are released).
//! Not for: the timing model itself (see `engine`) or JSON shapes (see `openai`).

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::task::{Context, Poll};
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Frame;
use hyper::header::{CACHE_CONTROL, CONTENT_TYPE, HeaderValue};
use hyper::{Response, StatusCode};
use serde_json::Value;
use tokio::sync::mpsc;
use tokio::time::{Duration, Instant, sleep_until};

use super::SimConfig;
use super::cache::block_hashes;
use super::driver::{EngineEvent, SimTicket};
use super::engine::EngineRequest;
use super::error::ApiError;
use super::instance::{Shared, SimBody, json_response};
use super::openai::{Meta, ReportedUsage, StreamWriter, full_response, output_text};
use super::template::{self, GenerationEndpoint};

/// Shortest real time between two streamed text events of one request.
pub const MIN_EVENT_INTERVAL: Duration = Duration::from_millis(1);

/// Seconds since the Unix epoch.
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// A request accepted by the engine, as the HTTP side tracks it.
struct Job {
    meta: Meta,
    ticket: SimTicket,
    events: mpsc::UnboundedReceiver<EngineEvent>,
    prompt_tokens: usize,
    output_tokens: usize,
    bytes_per_token: usize,
    /// Longest prompt plus output the instance accepts, tokens.
    limit: usize,
    /// The blocks it hands over to a remote decode, when it is a disaggregated request's
    /// prefill leg (`kv_transfer_params.do_remote_decode`).
    handed_over: Option<usize>,
}

impl Job {
    fn usage(&self, cached_tokens: usize) -> ReportedUsage {
        let (prompt_tokens, completion_tokens) = (self.prompt_tokens, self.output_tokens);
        ReportedUsage {
            prompt_tokens,
            cached_tokens,
            completion_tokens,
        }
    }

    fn rejected(&self) -> ApiError {
        too_long(self.prompt_tokens, self.output_tokens, self.limit)
    }
}

/// The header that sets a request's priority, as vLLM's, in place of its body's field.
const PRIORITY_HEADER: &str = "x-vllm-priority";

/// A request's priority from its `X-Vllm-Priority` header, if it carries a valid integer
/// (vLLM skips one that is not).
pub fn header_priority(headers: &hyper::HeaderMap) -> Option<i64> {
    let value = headers.get(PRIORITY_HEADER)?.to_str().ok()?;
    value.trim().parse().ok()
}

/// Handles one generation request whose body is `body`, of `priority` when its header
/// set one (else its body's `priority`).
pub async fn generate(
    shared: &Arc<Shared>,
    endpoint: GenerationEndpoint,
    body: Bytes,
    priority: Option<i64>,
) -> Result<Response<SimBody>, ApiError> {
    let config = &shared.config;
    let number = shared.next_number.fetch_add(1, Relaxed);
    let (mut request, stream) = prepare(config, endpoint, &body, number)?;
    let hands_over = hands_over(&body);
    drop(body);
    request.priority = priority.unwrap_or(request.priority);
    let (prompt_tokens, output_tokens) = (request.prompt_tokens, request.output_tokens);
    // An answer as long as the model's own is one it ended.
    let stopped = config.answer_tokens == Some(output_tokens);
    let (ticket, events) = shared.engine.submit(request).ok_or(ApiError::EngineGone)?;
    let meta = Meta {
        endpoint,
        number,
        created: unix_now(),
        model: config.model.clone(),
        instance: config.name.clone(),
        stopped,
    };
    let (bytes_per_token, limit) = (config.bytes_per_token, token_limit(config));
    let job = Job {
        meta,
        ticket,
        events,
        prompt_tokens,
        output_tokens,
        bytes_per_token,
        limit,
        handed_over: hands_over.then(|| prompt_tokens / config.block_tokens.max(1)),
    };
    if stream {
        Ok(stream_response(job))
    } else {
        complete(job).await
    }
}

/// What the engine gets for a generation request body of `endpoint`: the prompt rendered
/// with the instance's template (the model's own with `--tokenizer`), counted in tokens
/// and hashed into blocks, as request `id`; and whether the client asked for a stream.
/// The lab feeds its engines through this too.
pub fn prepare(
    config: &SimConfig,
    endpoint: GenerationEndpoint,
    raw: &[u8],
    id: u64,
) -> Result<(EngineRequest, bool), ApiError> {
    let body: Value = serde_json::from_slice(raw)?;
    let parsed = template::parse(endpoint, &body, config.bytes_per_token)?;
    let publishes = config.kv_events.as_ref().is_some_and(|k| k.publishes());
    let (prompt_tokens, hashes, token_ids) = match &config.tokenizer {
        Some(model) => {
            let ids = model.ids(endpoint, raw)?;
            let bytes: Vec<u8> = ids.iter().flat_map(|id| id.to_le_bytes()).collect();
            let hashes = block_hashes(&bytes, config.block_tokens.saturating_mul(4));
            (ids.len(), hashes, if publishes { ids } else { Vec::new() })
        }
        None => {
            let block_bytes = config.block_tokens.saturating_mul(config.bytes_per_token);
            let tokens = template::token_count(&parsed.prompt, config.bytes_per_token);
            let ids = if publishes {
                word_ids(&parsed.prompt, config.bytes_per_token)
            } else {
                Vec::new()
            };
            (tokens, block_hashes(&parsed.prompt, block_bytes), ids)
        }
    };
    check_length(config, prompt_tokens, parsed.output_tokens)?;
    let answer = config.answer_tokens.unwrap_or(usize::MAX);
    let request = EngineRequest {
        id,
        hashes,
        prompt_tokens,
        output_tokens: parsed.output_tokens.min(answer),
        token_ids,
        priority: body_priority(&body)?,
        remote_blocks: remote_blocks(&body),
    };
    Ok((request, parsed.stream))
}

/// Blocks a remote prefill computed for this request: as many as its `kv_transfer_params`
/// name (`remote_block_ids`) when they ask for a remote prefill's KV
/// (`do_remote_prefill`), as vLLM's KV connectors do on a decode instance.
fn remote_blocks(body: &Value) -> usize {
    let params = &body["kv_transfer_params"];
    let remote = params["do_remote_prefill"].as_bool() == Some(true);
    (params["remote_block_ids"].as_array())
        .filter(|_| remote)
        .map_or(0, Vec::len)
}

/// Whether the request is a prefill leg whose KV a remote decode will load
/// (`kv_transfer_params.do_remote_decode`).
fn hands_over(raw: &[u8]) -> bool {
    const ASKED: &[u8] = b"do_remote_decode";
    if !raw.windows(ASKED.len()).any(|w| w == ASKED) {
        return false;
    }
    let body: Value = serde_json::from_slice(raw).unwrap_or_default();
    body["kv_transfer_params"]["do_remote_decode"].as_bool() == Some(true)
}

/// The `kv_transfer_params` of a prefill leg's answer, for its decode leg: the `blocks`
/// the decode instance loads (their ids here are their positions), and from where.
fn transfer_params(meta: &Meta, blocks: usize) -> Value {
    serde_json::json!({
        "do_remote_prefill": true, "do_remote_decode": false,
        "remote_engine_id": meta.instance, "remote_block_ids": (0..blocks).collect::<Vec<_>>(),
        "remote_host": null, "remote_port": null,
    })
}

/// The body's `priority` (default 0), an integer as vLLM requires.
fn body_priority(body: &Value) -> Result<i64, ApiError> {
    match body.get("priority") {
        None | Some(Value::Null) => Ok(0),
        Some(value) => value.as_i64().ok_or_else(|| ApiError::InvalidRequest {
            message: "priority must be an integer".into(),
            param: Some("priority"),
        }),
    }
}

/// The built-in tokenizer's token ids: each `bytes_per_token` bytes of the prompt, as a
/// little-endian word when they fit in 4 bytes (so the ids' bytes are the prompt's), else
/// hashed.
fn word_ids(prompt: &[u8], bytes_per_token: usize) -> Vec<u32> {
    (prompt.chunks(bytes_per_token.max(1)))
        .map(|chunk| match chunk.len() {
            1..=4 => {
                let mut word = [0; 4];
                word[..chunk.len()].copy_from_slice(chunk);
                u32::from_le_bytes(word)
            }
            _ => xxhash_rust::xxh3::xxh3_64(chunk) as u32,
        })
        .collect()
}

/// Refuses empty prompts, and prompts plus output beyond `max_model_len` or the KV cache.
fn check_length(
    config: &SimConfig,
    prompt_tokens: usize,
    output_tokens: usize,
) -> Result<(), ApiError> {
    if prompt_tokens == 0 {
        return Err(ApiError::invalid("prompt", "the prompt is empty"));
    }
    let limit = token_limit(config);
    if prompt_tokens.saturating_add(output_tokens) > limit {
        return Err(too_long(prompt_tokens, output_tokens, limit));
    }
    Ok(())
}

/// Longest prompt plus output: `max_model_len`, or the whole KV cache if smaller.
fn token_limit(config: &SimConfig) -> usize {
    config
        .max_model_len
        .min(config.kv_blocks.saturating_mul(config.block_tokens))
}

fn too_long(prompt: usize, output: usize, limit: usize) -> ApiError {
    ApiError::TooLong {
        limit,
        total: prompt.saturating_add(output),
        prompt,
        output,
    }
}

/// Waits for the first token; returns its cached tokens, time and the token interval.
async fn first_token(job: &mut Job) -> Result<(usize, Instant, Duration), ApiError> {
    match job.events.recv().await {
        Some(EngineEvent::FirstToken {
            cached_tokens,
            first_at,
            interval,
        }) => Ok((cached_tokens, first_at, interval)),
        Some(EngineEvent::Rejected) => Err(job.rejected()),
        Some(EngineEvent::Finished) | None => Err(ApiError::EngineGone),
    }
}

async fn finished(job: &mut Job) -> Result<(), ApiError> {
    while let Some(event) = job.events.recv().await {
        if event == EngineEvent::Finished {
            job.ticket.complete();
            return Ok(());
        }
    }
    Err(ApiError::EngineGone)
}

/// Non-streaming: answers once the engine has generated every token.
async fn complete(mut job: Job) -> Result<Response<SimBody>, ApiError> {
    let (cached_tokens, _, _) = first_token(&mut job).await?;
    finished(&mut job).await?;
    let text = output_text(0, job.output_tokens, job.bytes_per_token);
    let mut body = full_response(&job.meta, &text, job.usage(cached_tokens));
    if let (Some(blocks), Some(fields)) = (job.handed_over, body.as_object_mut()) {
        fields.insert(
            "kv_transfer_params".into(),
            transfer_params(&job.meta, blocks),
        );
    }
    Ok(json_response(StatusCode::OK, &body))
}

/// A response body fed by a channel of ready-made SSE events.
struct ChannelBody {
    rx: mpsc::Receiver<Bytes>,
}

impl hyper::body::Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.get_mut()
            .rx
            .poll_recv(cx)
            .map(|event| event.map(|bytes| Ok(Frame::data(bytes))))
    }
}

fn stream_response(job: Job) -> Response<SimBody> {
    let (tx, rx) = mpsc::channel(32);
    tokio::spawn(stream_task(job, tx));
    let mut response = Response::new(ChannelBody { rx }.boxed());
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

/// The client went away (its body was dropped).
struct Gone;

async fn send_all(tx: &mpsc::Sender<Bytes>, events: Vec<Bytes>) -> Result<(), Gone> {
    for event in events {
        tx.send(event).await.map_err(|_| Gone)?;
    }
    Ok(())
}

async fn stream_task(mut job: Job, tx: mpsc::Sender<Bytes>) {
    let mut writer = StreamWriter::new(job.meta.clone());
    if send_all(&tx, writer.start()).await.is_err() {
        return;
    }
    let first = tokio::select! {
        first = first_token(&mut job) => first,
        () = tx.closed() => return,
    };
    let _ = match first {
        Ok(first) => stream_tokens(&mut job, &mut writer, &tx, first).await,
        Err(err) => send_all(&tx, vec![Bytes::from(format!("data: {}\n\n", err.body()))]).await,
    };
}

async fn stream_tokens(
    job: &mut Job,
    writer: &mut StreamWriter,
    tx: &mpsc::Sender<Bytes>,
    (cached_tokens, first_at, interval): (usize, Instant, Duration),
) -> Result<(), Gone> {
    send_all(tx, writer.first()).await?;
    let (total, bpt) = (job.output_tokens, job.bytes_per_token);
    let mut sent = 0;
    loop {
        let due = tokens_due(Instant::now(), first_at, interval, total);
        if due > sent {
            tx.send(writer.delta(&output_text(sent, due - sent, bpt)))
                .await
                .map_err(|_| Gone)?;
            sent = due;
        }
        if sent >= total {
            break;
        }
        let next = token_time(first_at, interval, sent);
        sleep_until(next.max(Instant::now() + MIN_EVENT_INTERVAL)).await;
    }
    if finished(job).await.is_err() {
        return Err(Gone);
    }
    let text = output_text(0, total, bpt);
    send_all(tx, writer.end(&text, job.usage(cached_tokens))).await
}

/// Output tokens out by `now`: the first at `first_at`, then one per `interval`.
fn tokens_due(now: Instant, first_at: Instant, interval: Duration, total: usize) -> usize {
    if interval.is_zero() {
        return total;
    }
    let elapsed = now.saturating_duration_since(first_at).as_nanos();
    let later = usize::try_from(elapsed / interval.as_nanos()).unwrap_or(usize::MAX);
    later.saturating_add(1).min(total)
}

/// When token `index` (0-based) is out.
fn token_time(first_at: Instant, interval: Duration, index: usize) -> Instant {
    let index = u32::try_from(index).unwrap_or(u32::MAX);
    interval
        .checked_mul(index)
        .and_then(|offset| first_at.checked_add(offset))
        .unwrap_or_else(|| Instant::now() + Duration::from_secs(86_400))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_schedule() {
        let t0 = Instant::now();
        let ms = Duration::from_millis(1);
        assert_eq!(tokens_due(t0, t0, ms * 7, 10), 1);
        assert_eq!(tokens_due(t0 + ms * 13, t0, ms * 7, 10), 2);
        assert_eq!(tokens_due(t0 + ms * 14, t0, ms * 7, 10), 3);
        assert_eq!(tokens_due(t0 + ms * 1000, t0, ms * 7, 10), 10);
        assert_eq!(tokens_due(t0, t0, Duration::ZERO, 10), 10);
        assert_eq!(token_time(t0, ms * 7, 3), t0 + ms * 21);
    }
}
