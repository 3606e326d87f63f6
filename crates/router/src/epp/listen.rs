//! The endpoint picker's listener: plain TCP (h2c), or TLS with the data listener's
//! certificate (`tls_cert_file`), which gateways that connect to their picker over TLS
//! need. The certificate is taken through its resolver at each handshake, so a reload
//! swaps it for new connections. Handshakes run off the accept loop, each bounded.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use log::debug;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::Connected;

use crate::tls::Certificate;

/// Longest TLS handshake, after which the connection is dropped.
const HANDSHAKE: Duration = Duration::from_secs(10);

/// Accepted connections waiting for the gRPC server.
const BACKLOG: usize = 64;

/// A connection of the gRPC server.
pub enum Conn {
    /// Plain HTTP/2.
    Plain(TcpStream),
    /// HTTP/2 over TLS.
    Tls(Box<TlsStream<TcpStream>>),
}

/// The connections `listener` accepts, over TLS with `certificate` when there is one.
pub fn incoming(
    listener: TcpListener,
    certificate: Option<Arc<Certificate>>,
) -> ReceiverStream<io::Result<Conn>> {
    let acceptor = certificate.map(|c| {
        crate::tls::install_provider();
        let mut config = ServerConfig::builder()
            .with_no_client_auth()
            .with_cert_resolver(c);
        config.alpn_protocols = vec![b"h2".to_vec()];
        TlsAcceptor::from(Arc::new(config))
    });
    let (conns, out) = mpsc::channel(BACKLOG);
    tokio::spawn(async move {
        loop {
            let stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                Err(e) => {
                    debug!("endpoint picker: accept failed: {e}");
                    continue;
                }
            };
            let _ = stream.set_nodelay(true);
            let Some(acceptor) = acceptor.clone() else {
                if conns.send(Ok(Conn::Plain(stream))).await.is_err() {
                    return;
                }
                continue;
            };
            let conns = conns.clone();
            tokio::spawn(async move {
                match tokio::time::timeout(HANDSHAKE, acceptor.accept(stream)).await {
                    Ok(Ok(tls)) => {
                        let _ = conns.send(Ok(Conn::Tls(Box::new(tls)))).await;
                    }
                    Ok(Err(e)) => debug!("endpoint picker: TLS handshake failed: {e}"),
                    Err(_) => debug!("endpoint picker: TLS handshake timed out"),
                }
            });
        }
    });
    ReceiverStream::new(out)
}

impl Connected for Conn {
    type ConnectInfo = ();

    fn connect_info(&self) {}
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Conn::Tls(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Conn::Tls(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_flush(cx),
            Conn::Tls(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Conn::Tls(s) => Pin::new(s).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Conn::Tls(s) => Pin::new(s).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Conn::Plain(s) => s.is_write_vectored(),
            Conn::Tls(s) => s.is_write_vectored(),
        }
    }
}
