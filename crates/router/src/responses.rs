//! Stateful Responses: which backend made each response. vLLM (with
//! `VLLM_ENABLE_RESPONSES_API_STORE=1`) keeps a response in the process that made it, so a
//! request naming it (`previous_response_id`, `GET`/`DELETE /v1/responses/{id}`, `POST
//! /v1/responses/{id}/cancel`) must reach that process. The id is read from the first
//! `"id"` of a successful `POST /v1/responses` answer, which is the response object's in
//! the JSON answer and in the stream's first event (`response.created`), and kept for
//! `session_ttl` after its last use. A request naming an id this table holds goes to its
//! backend, or gets 404 when that backend is gone; one naming an id it does not hold is
//! routed as any other (the backends answer for it). Replicas share the ids through the
//! shared table (`crate::replication`).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use prefix_router_core::BackendId;
use xxhash_rust::xxh3::xxh3_128;

use crate::error::RouterError;
use crate::fleet::Fleet;

/// Ids remembered at most; past it, expired ones are swept and, if none were, the oldest
/// half is forgotten.
const MAX_IDS: usize = 1 << 20;
/// Bytes of an answer's start searched for its id.
const SEARCHED: usize = 4096;
/// Longest id kept, bytes.
const MAX_ID: usize = 256;

/// The addresses a request naming the response `id` may go to: its backend's among
/// `fleet`'s, when `homes` holds the id (404 `response_not_found` when that backend is not
/// ready); `None` when it does not: any backend.
pub fn pinned(
    homes: &ResponseHomes,
    fleet: &Fleet,
    id: &[u8],
) -> Result<Option<Arc<[SocketAddr]>>, RouterError> {
    let Some(home) = homes.home(id) else {
        return Ok(None);
    };
    let ready = fleet.ready(&[]).only(home);
    match ready.backend(0) {
        Some(backend) => Ok(Some(Arc::from([backend.addr]))),
        None => Err(RouterError::ResponseGone(
            String::from_utf8_lossy(&id[..id.len().min(MAX_ID)]).into_owned(),
        )),
    }
}

/// Response ids and the backend that made each.
pub struct ResponseHomes {
    ttl: Duration,
    ids: Mutex<HashMap<u128, (BackendId, Instant)>>,
    /// Told of each id this router learns (the shared table publishes it).
    sink: OnceLock<ResponseIdSink>,
}

type ResponseIdSink = Box<dyn Fn(u128, BackendId) + Send + Sync>;

impl ResponseHomes {
    /// An empty table whose ids expire `ttl` after their last use.
    pub fn new(ttl: Duration) -> Self {
        ResponseHomes {
            ttl,
            ids: Mutex::new(HashMap::new()),
            sink: OnceLock::new(),
        }
    }

    /// From now on, `sink` is told of each id this router learns, as its key (replicas
    /// share them through the shared table); set once.
    pub fn on_note(&self, sink: impl Fn(u128, BackendId) + Send + Sync + 'static) {
        let _ = self.sink.set(Box::new(sink));
    }

    /// `backend` made the response `id`.
    pub fn note(&self, id: &[u8], backend: BackendId) {
        let key = xxh3_128(id);
        self.merge(key, backend);
        if let Some(sink) = self.sink.get() {
            sink(key, backend);
        }
    }

    /// `backend` made the response whose key is `key` (learnt by another replica).
    pub fn merge(&self, key: u128, backend: BackendId) {
        let now = Instant::now();
        let mut ids = self.ids.lock();
        if ids.len() >= MAX_IDS {
            ids.retain(|_, (_, used)| now.duration_since(*used) < self.ttl);
        }
        if ids.len() >= MAX_IDS {
            let mut ages: Vec<Instant> = ids.values().map(|(_, used)| *used).collect();
            let (_, middle, _) = ages.select_nth_unstable(MAX_IDS / 2);
            let middle = *middle;
            ids.retain(|_, (_, used)| *used >= middle);
        }
        ids.insert(key, (backend, now));
    }

    /// The backend that made the response `id`, if it is remembered and not expired.
    pub fn home(&self, id: &[u8]) -> Option<BackendId> {
        self.home_key(xxh3_128(id))
    }

    /// The backend that made the response whose key is `key`.
    pub fn home_key(&self, key: u128) -> Option<BackendId> {
        let now = Instant::now();
        let mut ids = self.ids.lock();
        let (backend, used) = ids.get_mut(&key)?;
        if now.duration_since(*used) >= self.ttl {
            return None;
        }
        *used = now;
        Some(*backend)
    }
}

/// The response id a path names: `/v1/responses/{id}`, `/v1/responses/{id}/cancel` and
/// `/v1/responses/{id}/input_items`.
pub fn path_id(path: &str) -> Option<&str> {
    let rest = path.split('?').next()?.strip_prefix("/v1/responses/")?;
    let id = ["/cancel", "/input_items"]
        .iter()
        .find_map(|tail| rest.strip_suffix(tail))
        .unwrap_or(rest);
    (!id.is_empty() && !id.contains('/')).then_some(id)
}

/// Notes the backend of the response a successful `POST /v1/responses` answer makes, as
/// soon as its id has been read: before the chunk holding it reaches the client, who may
/// name it in its next request on another connection.
pub struct IdNote<'h> {
    homes: &'h ResponseHomes,
    backend: BackendId,
    scanner: IdScanner,
}

impl<'h> IdNote<'h> {
    /// Notes in `homes` that `backend` made the response the answer names.
    pub fn new(homes: &'h ResponseHomes, backend: BackendId) -> Self {
        IdNote {
            homes,
            backend,
            scanner: IdScanner::default(),
        }
    }

    /// Looks at the answer's next chunk, before the client gets it.
    pub fn feed(&mut self, chunk: &[u8]) {
        if let Some(id) = self.scanner.feed(chunk) {
            self.homes.note(id, self.backend);
        }
    }
}

/// Finds the first `"id":"…"` in the start of an answer, fed chunk by chunk.
#[derive(Default)]
pub struct IdScanner {
    seen: Vec<u8>,
    done: bool,
}

impl IdScanner {
    /// Looks at the next chunk; the id when this chunk completes it. Stops looking once
    /// the id was found or [`SEARCHED`] bytes were seen.
    pub fn feed(&mut self, chunk: &[u8]) -> Option<&[u8]> {
        if self.done {
            return None;
        }
        let room = SEARCHED.saturating_sub(self.seen.len());
        self.seen.extend_from_slice(&chunk[..chunk.len().min(room)]);
        self.done = self.id().is_some() || self.seen.len() >= SEARCHED;
        self.id()
    }

    /// The id found, if any.
    pub fn id(&self) -> Option<&[u8]> {
        let key = b"\"id\"";
        let at = self.seen.windows(key.len()).position(|w| w == key)?;
        let rest = &self.seen[at + key.len()..];
        let open = rest.iter().position(|b| !matches!(b, b' ' | b':'))?;
        let rest = rest[open..].strip_prefix(b"\"")?;
        let end = rest.iter().position(|b| *b == b'"' || *b == b'\\')?;
        let id = &rest[..end];
        (!id.is_empty() && id.len() <= MAX_ID && rest[end] == b'"').then_some(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_streamed_and_a_json_answer_give_their_response_id() {
        let stream = b"event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_ab12\",\"object\":\"response\"}}\n\n";
        for cut in 0..stream.len() {
            let mut scanner = IdScanner::default();
            scanner.feed(&stream[..cut]);
            scanner.feed(&stream[cut..]);
            assert_eq!(scanner.id(), Some(&b"resp_ab12"[..]), "cut at {cut}");
        }
        let mut json = IdScanner::default();
        json.feed(br#"{"id": "resp_9", "object": "response", "output": [{"id": "msg_1"}]}"#);
        assert_eq!(json.id(), Some(&b"resp_9"[..]));
        let mut none = IdScanner::default();
        none.feed(&[b' '; 5000]);
        none.feed(br#"{"id":"late"}"#);
        assert_eq!(none.id(), None, "only the start of an answer is searched");
    }

    #[test]
    fn ids_are_remembered_until_their_ttl() {
        let homes = ResponseHomes::new(Duration::from_millis(50));
        homes.note(b"resp_1", BackendId(3));
        assert_eq!(homes.home(b"resp_1"), Some(BackendId(3)));
        assert_eq!(homes.home(b"resp_2"), None);
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(homes.home(b"resp_1"), None);
    }

    #[test]
    fn paths_name_their_response() {
        assert_eq!(path_id("/v1/responses/resp_1"), Some("resp_1"));
        assert_eq!(path_id("/v1/responses/resp_1/cancel"), Some("resp_1"));
        assert_eq!(
            path_id("/v1/responses/resp_1/input_items?limit=2"),
            Some("resp_1")
        );
        assert_eq!(path_id("/v1/responses"), None);
        assert_eq!(path_id("/v1/responses/a/b/c"), None);
    }
}
