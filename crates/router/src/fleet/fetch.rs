//! GETs of a backend's own pages (the health path, `/metrics`, `/v1/models`, `/props`)
//! over its peer: TLS for an `https://` worker, verified as the fleet says, with the
//! `Host` it is named by. Connections are kept between reads.
//!
//! Ours rather than `reqwest` (which the backends' pages were read with before TLS) so
//! that one peer per backend carries its TLS settings everywhere, with no second TLS
//! stack; and rather than Pingora's `HttpHealthCheck`, whose one peer template gives all
//! backends one SNI and one `Host`, and no CA file.

use std::time::Duration;

use pingora_core::connectors::http::Connector;
use pingora_core::upstreams::peer::Peer;
use pingora_core::{Error, ErrorType, Result};
use pingora_http::RequestHeader;

use super::{Backend, Fleet};

/// A connector for one background task's reads of the fleet's backends.
pub struct Fetcher {
    connector: Connector,
}

impl Fetcher {
    /// A connector trusting what `fleet` is told to trust.
    pub fn new(fleet: &Fleet) -> Self {
        Fetcher {
            connector: Connector::new(fleet.tls().connector()),
        }
    }

    /// The first `max` bytes of the body of a 200 answer to `GET path` from `backend`,
    /// within `timeout` for each step; an error for any other status. The connection is
    /// kept for the next read whenever the body was read whole, whatever the status.
    pub async fn get(
        &self,
        backend: &Backend,
        path: &http::Uri,
        timeout: Duration,
        max: usize,
    ) -> Result<Vec<u8>> {
        let mut peer = backend.peer.clone();
        let options = &mut peer.options;
        (options.connection_timeout, options.total_connection_timeout) =
            (Some(timeout), Some(timeout));
        (options.read_timeout, options.write_timeout) = (Some(timeout), Some(timeout));
        let mut request = RequestHeader::build("GET", b"/", None)?;
        request.set_uri(path.clone());
        request.insert_header(http::header::HOST, &backend.authority)?;
        let (mut session, _) = self.connector.get_http_session(&peer).await?;
        session.write_request_header(Box::new(request)).await?;
        session.finish_request_body().await?;
        session.read_response_header().await?;
        let status = session.response_header().map_or(0, |h| h.status.as_u16());
        let mut body = Vec::new();
        let mut whole = true;
        while let Some(chunk) = session.read_response_body().await? {
            body.extend_from_slice(&chunk[..chunk.len().min(max - body.len())]);
            if body.len() == max {
                // The rest is unread: the connection cannot be reused.
                whole = false;
                break;
            }
        }
        if whole {
            let idle = peer.idle_timeout();
            self.connector
                .release_http_session(session, &peer, idle)
                .await;
        }
        if status != 200 {
            let path = path.to_string();
            return Error::e_explain(
                ErrorType::CustomCode("not 200", status),
                format!("GET {path}"),
            );
        }
        Ok(body)
    }
}
