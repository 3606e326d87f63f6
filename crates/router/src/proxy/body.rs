//! Reading the whole request body before a backend is chosen: framing checked and the size
//! cap enforced before anything is read, the bytes taken from the router's [`Budget`]
//! (declared ones before `100 Continue` is answered and before reading, chunked ones as
//! they come), and the body gathered in one buffer sized from Content-Length (a body that
//! arrives in one piece is kept as it is).

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use http::header::{CONTENT_LENGTH, EXPECT, TRANSFER_ENCODING};
use pingora_core::{Error, ErrorType};
use pingora_http::RequestHeader;
use pingora_proxy::Session;

use crate::admission::budget::{self, Budget, Permit};
use crate::error::{RouterError, ShedReason};
use crate::limits::Limits;

/// A body read whole, with the budget bytes it holds until it drops.
pub struct Body {
    /// The bytes, as the client sent them.
    pub bytes: Bytes,
    _permit: Permit,
}

impl Body {
    /// `bytes`, holding `permit`'s budget bytes.
    pub fn new(bytes: Bytes, permit: Permit) -> Self {
        Body {
            bytes,
            _permit: permit,
        }
    }

    /// Replaces its bytes (a leg's rewritten body, about the client's size), keeping its
    /// budget.
    pub fn replace(&mut self, bytes: Bytes) {
        self.bytes = bytes;
    }
}

/// How a body may be read.
pub struct Reading<'r> {
    /// Largest body, bytes.
    pub limit: usize,
    /// Silence allowed between reads.
    pub pause: Duration,
    /// Time for the whole body.
    pub total: Duration,
    /// Longest wait for budget bytes.
    pub admission: Duration,
    /// The budget the bytes come from.
    pub budget: &'r Arc<Budget>,
}

impl<'r> Reading<'r> {
    /// Reading as `limits` allow, from `budget`.
    pub fn new(limits: &Limits, budget: &'r Arc<Budget>) -> Self {
        Reading {
            limit: limits.max_body_bytes,
            pause: limits.client_read,
            total: limits.client_body,
            admission: limits.admission_timeout,
            budget,
        }
    }
}

/// The declared body length, after refusing ambiguous framing (request smuggling): two
/// Content-Length values, or Content-Length together with Transfer-Encoding.
pub fn declared_length(req: &RequestHeader) -> Result<Option<usize>, RouterError> {
    let mut lengths = req.headers.get_all(CONTENT_LENGTH).iter();
    let Some(first) = lengths.next() else {
        return Ok(None);
    };
    if lengths.next().is_some() {
        return Err(malformed("more than one Content-Length header"));
    }
    if req.headers.contains_key(TRANSFER_ENCODING) {
        return Err(malformed("both Content-Length and Transfer-Encoding"));
    }
    let text = first
        .to_str()
        .map_err(|_| malformed("invalid Content-Length"))?;
    let length = text
        .trim()
        .parse()
        .map_err(|_| malformed("invalid Content-Length"))?;
    Ok(Some(length))
}

/// Whether the client waits for `100 Continue` before sending its body.
fn expects_continue(req: &RequestHeader) -> bool {
    req.headers
        .get(EXPECT)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"))
}

/// Reads the whole body as `how` allows.
pub async fn read(session: &mut Session, how: &Reading<'_>) -> Result<Body, RouterError> {
    let mut permit = Permit::new(how.budget);
    let declared = declared_length(session.req_header())?;
    if declared.is_some_and(|n| n > how.limit) {
        return Err(RouterError::BodyTooLarge { limit: how.limit });
    }
    if session.is_body_empty() {
        return Ok(Body {
            bytes: Bytes::new(),
            _permit: permit,
        });
    }
    let admission = budget::deadline(how.admission);
    if let Some(n) = declared {
        take(&mut permit, n, admission, how).await?;
    }
    if expects_continue(session.req_header()) {
        session
            .write_continue_response()
            .await
            .map_err(client_error)?;
    }
    session.set_read_timeout(Some(how.pause));
    let gathered =
        tokio::time::timeout(how.total, gather(session, declared, &mut permit, how)).await;
    let bytes = gathered.map_err(|_| RouterError::ClientTimeout)??;
    Ok(Body {
        bytes,
        _permit: permit,
    })
}

/// Takes `more` budget bytes, waiting at most until `deadline`.
async fn take(
    permit: &mut Permit,
    more: usize,
    deadline: Instant,
    how: &Reading<'_>,
) -> Result<(), RouterError> {
    let waited = permit.grow(more, deadline).await;
    waited.map_err(|_| RouterError::Overloaded {
        shed: ShedReason::Budget,
        retry_after: how.admission.as_secs().max(1),
    })
}

async fn gather(
    session: &mut Session,
    declared: Option<usize>,
    permit: &mut Permit,
    how: &Reading<'_>,
) -> Result<Bytes, RouterError> {
    let limit = how.limit;
    let Some(first) = session.read_request_body().await.map_err(client_error)? else {
        return Ok(Bytes::new());
    };
    if declared == Some(first.len()) {
        return Ok(first);
    }
    let mut buf = BytesMut::with_capacity(declared.unwrap_or(first.len() * 2).min(limit));
    append(&mut buf, &first, permit, how).await?;
    while let Some(chunk) = session.read_request_body().await.map_err(client_error)? {
        append(&mut buf, &chunk, permit, how).await?;
    }
    Ok(buf.freeze())
}

/// Appends `chunk` to `buf` within the size limit of `how`, taking the budget bytes it
/// needs beyond those `permit` holds (a declared body took them up front, a chunked one
/// takes them as they come).
pub async fn append(
    buf: &mut BytesMut,
    chunk: &[u8],
    permit: &mut Permit,
    how: &Reading<'_>,
) -> Result<(), RouterError> {
    let limit = how.limit;
    if buf.len() + chunk.len() > limit {
        return Err(RouterError::BodyTooLarge { limit });
    }
    let more = (buf.len() + chunk.len()).saturating_sub(permit.bytes());
    take(permit, more, budget::deadline(how.admission), how).await?;
    buf.extend_from_slice(chunk);
    Ok(())
}

fn malformed(reason: &str) -> RouterError {
    RouterError::Malformed(format!("malformed request: {reason}"))
}

/// Maps a failure reading from the client.
pub fn client_error(e: Box<Error>) -> RouterError {
    match e.etype() {
        ErrorType::ReadTimedout | ErrorType::WriteTimedout => RouterError::ClientTimeout,
        ErrorType::InvalidHTTPHeader => malformed("invalid framing"),
        ErrorType::ConnectionClosed => RouterError::ClientGone("connection closed".into()),
        ErrorType::Custom("InvalidChunk") => malformed("invalid chunked body"),
        _ => RouterError::ClientGone(crate::error::reason(&e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(pairs: &[(&str, &str)]) -> RequestHeader {
        let mut req = RequestHeader::build("POST", b"/v1/completions", None).unwrap();
        for (k, v) in pairs {
            req.append_header(k.to_string(), *v).unwrap();
        }
        req
    }

    #[test]
    fn framing_checks() {
        assert_eq!(
            declared_length(&header(&[("content-length", "12")])).unwrap(),
            Some(12)
        );
        assert_eq!(declared_length(&header(&[])).unwrap(), None);
        let two = header(&[("content-length", "1"), ("content-length", "1")]);
        assert!(declared_length(&two).is_err());
        let both = header(&[("content-length", "1"), ("transfer-encoding", "chunked")]);
        assert!(declared_length(&both).is_err());
        assert!(declared_length(&header(&[("content-length", "x")])).is_err());
    }

    #[test]
    fn continue_is_case_insensitive() {
        assert!(expects_continue(&header(&[("expect", "100-Continue")])));
        assert!(!expects_continue(&header(&[])));
    }
}
