//! The HTTP/1.1 server of one simulated instance: accept loop, routing, and the
//! small endpoints (`/health`, `/v1/models`, `/metrics`, `/tokenize`).
//!
//! For: speaking vLLM's OpenAI-compatible HTTP surface and turning every
//! [`ApiError`] into an OpenAI error body. Generation endpoints are in `generate`.
//! Not for: HTTP/2, TLS or authentication (the simulator accepts any request).

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

use super::SimConfig;
use super::error::ApiError;
use super::generate;
use super::instance::{Shared, SimBody, error_response, full, json_response};
use super::template::{self, GenerationEndpoint};

/// Largest request body accepted, bytes.
pub const MAX_BODY_BYTES: usize = 64 * 1024 * 1024;

/// Accepts connections until the task is aborted; dropping it closes them all.
pub async fn serve(listener: TcpListener, shared: Arc<Shared>) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    connections.spawn(serve_connection(stream, shared.clone()));
                }
                Err(err) => {
                    log::warn!("sim {}: accept failed: {err}", shared.config.name);
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                }
            },
            Some(_) = connections.join_next() => {}
        }
    }
}

async fn serve_connection(stream: TcpStream, shared: Arc<Shared>) {
    let _ = stream.set_nodelay(true);
    let service = service_fn(move |request| {
        let shared = shared.clone();
        async move { Ok::<_, Infallible>(route(shared, request).await) }
    });
    if let Err(err) = http1::Builder::new()
        .serve_connection(TokioIo::new(stream), service)
        .await
    {
        log::debug!("sim connection ended: {err}");
    }
}

async fn route(shared: Arc<Shared>, request: Request<Incoming>) -> Response<SimBody> {
    let result = dispatch(&shared, request).await;
    let mut response = result.unwrap_or_else(|err| error_response(&err));
    if let Some(value) = &shared.instance_header {
        response
            .headers_mut()
            .insert("x-sim-instance", value.clone());
    }
    response
}

/// The endpoints, by path.
enum HttpRoute {
    Health,
    Models,
    Metrics,
    Tokenize,
    CountTokens,
    Generate(GenerationEndpoint),
}

impl HttpRoute {
    fn of(path: &str) -> Option<(Self, Method)> {
        let route = match path {
            "/health" => (Self::Health, Method::GET),
            "/v1/models" => (Self::Models, Method::GET),
            "/metrics" => (Self::Metrics, Method::GET),
            "/tokenize" => (Self::Tokenize, Method::POST),
            "/v1/chat/completions" => (Self::Generate(GenerationEndpoint::Chat), Method::POST),
            "/v1/completions" => (
                Self::Generate(GenerationEndpoint::Completions),
                Method::POST,
            ),
            "/v1/responses" => (Self::Generate(GenerationEndpoint::Responses), Method::POST),
            "/v1/messages" => (Self::Generate(GenerationEndpoint::Messages), Method::POST),
            "/v1/messages/count_tokens" => (Self::CountTokens, Method::POST),
            _ => return None,
        };
        Some(route)
    }
}

async fn dispatch(
    shared: &Arc<Shared>,
    request: Request<Incoming>,
) -> Result<Response<SimBody>, ApiError> {
    let path = request.uri().path();
    let Some((route, allowed)) = HttpRoute::of(path) else {
        return Err(ApiError::NotFound(path.to_owned()));
    };
    if request.method() != allowed {
        let (method, path) = (request.method().to_string(), path.to_owned());
        return Err(ApiError::MethodNotAllowed { method, path });
    }
    match route {
        HttpRoute::Health => Ok(full(StatusCode::OK, None, Bytes::new())),
        HttpRoute::Models => Ok(json_response(StatusCode::OK, &models(&shared.config))),
        HttpRoute::Metrics => Ok(metrics(shared)),
        HttpRoute::Tokenize => tokenize(shared, &read_body(request).await?),
        HttpRoute::CountTokens => count_tokens(shared, &read_body(request).await?),
        HttpRoute::Generate(endpoint) => {
            let priority = generate::header_priority(request.headers());
            generate::generate(shared, endpoint, read_body(request).await?, priority).await
        }
    }
}

/// Reads the whole body (at most [`MAX_BODY_BYTES`]).
async fn read_body(request: Request<Incoming>) -> Result<Bytes, ApiError> {
    let collected = Limited::new(request.into_body(), MAX_BODY_BYTES)
        .collect()
        .await;
    let bytes = match collected {
        Ok(collected) => collected.to_bytes(),
        Err(err) if err.is::<http_body_util::LengthLimitError>() => {
            return Err(ApiError::BodyTooLarge {
                limit: MAX_BODY_BYTES,
            });
        }
        Err(err) => return Err(ApiError::BodyRead(err.to_string())),
    };
    Ok(bytes)
}

fn models(config: &SimConfig) -> Value {
    json!({"object": "list", "data": [{
        "id": config.model,
        "object": "model",
        "created": generate::unix_now(),
        "owned_by": "vllm",
        "root": config.model,
        "parent": null,
        "max_model_len": config.max_model_len,
        "permission": [],
    }]})
}

fn metrics(shared: &Shared) -> Response<SimBody> {
    let config = &shared.config;
    let text = shared
        .metrics
        .render(&config.model, config.kv_blocks, config.block_tokens);
    full(
        StatusCode::OK,
        Some("text/plain; version=0.0.4; charset=utf-8"),
        Bytes::from(text),
    )
}

/// vLLM's `/v1/messages/count_tokens`: `{"input_tokens"}`, the whole rendered prompt.
fn count_tokens(shared: &Shared, raw: &[u8]) -> Result<Response<SimBody>, ApiError> {
    let body: Value = serde_json::from_slice(raw)?;
    let bpt = shared.config.bytes_per_token;
    let parsed = template::parse(GenerationEndpoint::Messages, &body, bpt)?;
    let count = template::token_count(&parsed.prompt, bpt);
    Ok(json_response(
        StatusCode::OK,
        &json!({"input_tokens": count}),
    ))
}

/// vLLM's `/tokenize`: `{"count", "max_model_len", "tokens", "token_strs": null}`.
fn tokenize(shared: &Shared, raw: &[u8]) -> Result<Response<SimBody>, ApiError> {
    let body: Value = serde_json::from_slice(raw)?;
    if !body.is_object() {
        return Err(ApiError::invalid(
            "body",
            "the request body must be a JSON object",
        ));
    }
    let bpt = shared.config.bytes_per_token;
    let tokens = match &shared.config.tokenizer {
        Some(model) => model.tokenize(raw)?,
        None => template::token_ids(&template::render_tokenize(&body, bpt)?, bpt),
    };
    let answer = json!({
        "count": tokens.len(),
        "max_model_len": shared.config.max_model_len,
        "tokens": tokens,
        "token_strs": null,
    });
    Ok(json_response(StatusCode::OK, &answer))
}
