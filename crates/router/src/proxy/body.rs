//! Reading the whole request body before a backend is chosen: framing checked and the size
//! cap enforced before anything is read, `100 Continue` answered, and the body gathered in
//! one buffer sized from Content-Length (a body that arrives in one piece is kept as it is).

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::header::{CONTENT_LENGTH, EXPECT, TRANSFER_ENCODING};
use pingora_core::{Error, ErrorType};
use pingora_http::RequestHeader;
use pingora_proxy::Session;

use crate::error::RouterError;

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

/// Reads the whole body, at most `limit` bytes, allowing `pause` between reads and `total`
/// for all of it.
pub async fn read(
    session: &mut Session,
    limit: usize,
    pause: Duration,
    total: Duration,
) -> Result<Bytes, RouterError> {
    let declared = declared_length(session.req_header())?;
    if declared.is_some_and(|n| n > limit) {
        return Err(RouterError::BodyTooLarge { limit });
    }
    if session.is_body_empty() {
        return Ok(Bytes::new());
    }
    if expects_continue(session.req_header()) {
        session
            .write_continue_response()
            .await
            .map_err(client_error)?;
    }
    session.set_read_timeout(Some(pause));
    match tokio::time::timeout(total, gather(session, declared, limit)).await {
        Ok(body) => body,
        Err(_) => Err(RouterError::ClientTimeout),
    }
}

async fn gather(
    session: &mut Session,
    declared: Option<usize>,
    limit: usize,
) -> Result<Bytes, RouterError> {
    let Some(first) = session.read_request_body().await.map_err(client_error)? else {
        return Ok(Bytes::new());
    };
    if declared == Some(first.len()) {
        return Ok(first);
    }
    let mut buf = BytesMut::with_capacity(declared.unwrap_or(first.len() * 2).min(limit));
    buf.extend_from_slice(&first);
    while let Some(chunk) = session.read_request_body().await.map_err(client_error)? {
        if buf.len() + chunk.len() > limit {
            return Err(RouterError::BodyTooLarge { limit });
        }
        buf.extend_from_slice(&chunk);
    }
    if buf.len() > limit {
        return Err(RouterError::BodyTooLarge { limit });
    }
    Ok(buf.freeze())
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
        _ => RouterError::ClientGone(e.to_string()),
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
