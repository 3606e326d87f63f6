//! Pinned upstream certificates. A certificate in `upstream_ca_file` that is byte for
//! byte the one a worker presents is accepted as pinned, even when it is marked as a CA,
//! as curl, nginx and Python accept it: `openssl req -x509 -addext subjectAltName=..`,
//! the most common recipe, makes such a certificate (CA:TRUE), which WebPKI refuses as
//! an end entity (`CaUsedAsEndEntity`). Everything else is verified fully, as before
//! ([`CaFileVerifier`] says what pinning does and does not waive).
//!
//! Pingora 0.9's rustls connector builds its own verifier and takes none from us (its
//! `ConnectorOptions` carry a CA file path, its peers' options no verifier, and its
//! post-handshake hook is for the OpenSSL variants only). What it does take is a peer's
//! own L4 connector (`PeerOptions::custom_l4`, returning a virtual socket), so a worker
//! verified against a CA file is connected by [`CaFileConnect`]: TCP and the rustls
//! handshake with [`CaFileVerifier`], and Pingora speaks plain HTTP/1.1 over the result.
//! The certificate is thus checked inside the handshake, before any request byte, on
//! every path that uses the peer, and a path that loses the connector fails closed (plain
//! HTTP to a TLS port). Chosen over `verify_cert = false` and a check after the handshake,
//! which every caller of the connector would have to remember (and one that forgot would
//! talk to anyone).

use super::{TlsError, provider};

use std::io;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use async_trait::async_trait;
use pingora_core::connectors::L4Connect;
use pingora_core::protocols::l4::socket::SocketAddr;
use pingora_core::protocols::l4::stream::Stream;
use pingora_core::protocols::l4::virt::{VirtualSockOpt, VirtualSocket, VirtualSocketStream};
use pingora_core::tls::CryptoProvider;
use pingora_core::{Error, ErrorType};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;
use tokio_rustls::rustls::client::WebPkiServerVerifier;
use tokio_rustls::rustls::client::danger::{
    HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier,
};
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use tokio_rustls::rustls::server::ParsedCertificate;
use tokio_rustls::rustls::{
    self, CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};

/// Opens TLS connections to one `https://` worker, verified with a [`CaFileVerifier`], for
/// Pingora to speak HTTP/1.1 over (it is the peer's `PeerOptions::custom_l4`). HTTP/1.1 is
/// offered by ALPN, as Pingora offers it for an HTTP/1 peer. The peer's
/// `total_connection_timeout` bounds TCP and the handshake together; Pingora applies its
/// `connection_timeout` to its own TCP connects only.
#[derive(Debug)]
pub struct CaFileConnect {
    /// The rustls configuration and the name the certificate must carry, or why there is
    /// none: every connection is then refused with it.
    handshake: Result<(Arc<ClientConfig>, ServerName<'static>), Arc<TlsError>>,
}

impl CaFileConnect {
    /// A connector to the worker at `host` (the SNI sent and the name verified), trusting
    /// the CA file at `ca_file`, read now.
    pub fn new(ca_file: &Path, host: &str) -> Self {
        let name = ServerName::try_from(host.to_string()).map_err(|e| TlsError::Host {
            host: host.to_string(),
            cause: e.to_string(),
        });
        let handshake = client_config(ca_file).and_then(|config| Ok((config, name?)));
        CaFileConnect {
            handshake: handshake.map_err(Arc::new),
        }
    }
}

#[async_trait]
impl L4Connect for CaFileConnect {
    async fn connect(&self, addr: &SocketAddr) -> pingora_core::Result<Stream> {
        let (config, name) = self.handshake.as_ref().map_err(|e| {
            Error::because(
                ErrorType::InvalidCert,
                "no TLS to this worker",
                Arc::clone(e),
            )
        })?;
        let Some(inet) = addr.as_inet() else {
            let context = format!("{addr} is not a TCP address");
            return Err(Error::explain(ErrorType::InternalError, context));
        };
        let failed = |etype, e| Error::because(etype, format!("connecting to {inet}"), e);
        let tcp = TcpStream::connect(inet)
            .await
            .map_err(|e| failed(ErrorType::ConnectError, e))?;
        // Before the handshake, as Pingora sets it on its own sockets: Nagle would hold
        // back the handshake's small writes.
        tcp.set_nodelay(true)
            .map_err(|e| failed(ErrorType::ConnectError, e))?;
        let tls = TlsConnector::from(Arc::clone(config))
            .connect(name.clone(), tcp)
            .await
            .map_err(|e| failed(ErrorType::TLSHandshakeFailure, e))?;
        Ok(VirtualSocketStream::new(Box::new(TlsSocket(tls))).into())
    }
}

/// A rustls client configuration verifying with the CA file at `path`.
fn client_config(path: &Path) -> Result<Arc<ClientConfig>, TlsError> {
    let verifier = CaFileVerifier::load(path)?;
    let mut config = ClientConfig::builder_with_provider(Arc::clone(&verifier.provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| ca_file_error(path, e))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

fn ca_file_error(path: &Path, cause: impl ToString) -> TlsError {
    TlsError::CaFile {
        path: path.display().to_string(),
        cause: cause.to_string(),
    }
}

/// Verifies a worker's certificate against a CA file's certificates, which are both roots
/// and pinned certificates.
///
/// WebPKI verification comes first, exactly as rustls's default verifier does it. When it
/// refuses, the certificate is still accepted as pinned if all of these hold:
/// - it is byte for byte one of the CA file's certificates;
/// - WebPKI's objection is one pinning waives ([`pinning_waives`]): who issued it;
/// - it names the worker's host in its subjectAltName, as a DNS name or an IP address (as
///   rustls and curl do; the common name is never read).
///
/// WebPKI checks a certificate's validity period before anything else, so a pinned
/// certificate that has expired or is not yet valid is refused. What it checks after
/// `CaUsedAsEndEntity` (the extended key usage) is not checked for a pinned certificate
/// marked as a CA. The handshake's signature is verified with the provider's algorithms
/// either way: a worker must hold the pinned certificate's key.
#[derive(Debug)]
pub struct CaFileVerifier {
    webpki: Arc<WebPkiServerVerifier>,
    pinned: Vec<CertificateDer<'static>>,
    provider: Arc<CryptoProvider>,
}

impl CaFileVerifier {
    /// Reads the PEM certificates of the CA file at `path`; at least one, every one usable
    /// as a root.
    pub fn load(path: &Path) -> Result<CaFileVerifier, TlsError> {
        let error = |cause: String| ca_file_error(path, cause);
        let pinned: Vec<_> = CertificateDer::pem_file_iter(path)
            .and_then(|certs| certs.collect())
            .map_err(|e| error(e.to_string()))?;
        let mut roots = RootCertStore::empty();
        for cert in &pinned {
            roots.add(cert.clone()).map_err(|e| error(e.to_string()))?;
        }
        let provider = provider().ok_or_else(|| error("no crypto provider".into()))?;
        let webpki = WebPkiServerVerifier::builder_with_provider(roots.into(), provider.clone())
            .build()
            .map_err(|e| error(e.to_string()))?;
        Ok(CaFileVerifier {
            webpki,
            pinned,
            provider,
        })
    }

    fn is_pinned(&self, cert: &CertificateDer<'_>) -> bool {
        self.pinned.iter().any(|p| p.as_ref() == cert.as_ref())
    }
}

/// Whether pinning waives what WebPKI refused a certificate for: who issued it. That is an
/// unknown issuer (a pinned leaf whose CA is not in the file, as curl accepts it) or a rule
/// rustls has no variant for, `CaUsedAsEndEntity` among them (a self-signed certificate
/// marked as a CA). Not a wrong name, a validity period, a purpose, or a bad encoding.
fn pinning_waives(refused: &rustls::Error) -> bool {
    matches!(
        refused,
        rustls::Error::InvalidCertificate(
            CertificateError::UnknownIssuer | CertificateError::Other(_)
        )
    )
}

impl ServerCertVerifier for CaFileVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let webpki = &self.webpki;
        match webpki.verify_server_cert(end_entity, intermediates, server_name, ocsp, now) {
            Err(refused) if pinning_waives(&refused) && self.is_pinned(end_entity) => {
                let cert = ParsedCertificate::try_from(end_entity)?;
                rustls::client::verify_server_name(&cert, server_name)?;
                Ok(ServerCertVerified::assertion())
            }
            webpki => webpki,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.webpki.supported_verify_schemes()
    }
}

/// A TLS connection to a worker, as Pingora's virtual socket.
#[derive(Debug)]
struct TlsSocket(TlsStream<TcpStream>);

impl VirtualSocket for TlsSocket {
    fn set_socket_option(&self, opt: VirtualSockOpt) -> io::Result<()> {
        match opt {
            VirtualSockOpt::NoDelay => self.0.get_ref().0.set_nodelay(true),
            // Pingora sets keepalive only on a peer that asks for it, and ours never do.
            opt => Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!("{opt:?} on a TLS worker connection"),
            )),
        }
    }
}

impl AsyncRead for TlsSocket {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_read(cx, buf)
    }
}

impl AsyncWrite for TlsSocket {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;
    use std::time::Duration;

    /// A certificate made by the common recipe, valid for a day (openssl's default
    /// extensions mark it CA:TRUE), in a directory of its own: its PEM file.
    fn self_signed(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "prefix-router-tls-unit-{}-{name}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let out = std::process::Command::new("openssl")
            .args(["req", "-x509", "-newkey", "ec", "-pkeyopt"])
            .args(["ec_paramgen_curve:prime256v1", "-nodes", "-days", "1"])
            .args(["-subj", "/CN=localhost", "-addext"])
            .args(["subjectAltName=DNS:localhost,IP:127.0.0.1"])
            .args(["-keyout", "k.pem", "-out", "c.pem"])
            .current_dir(&dir)
            .output()
            .expect("openssl (Debian's openssl package) runs");
        assert!(out.status.success(), "{out:?}");
        dir.join("c.pem")
    }

    /// What a verifier trusting `ca_file` says of the certificate in `presented` for `host`
    /// at `now`.
    fn verify(
        ca_file: &Path,
        presented: &Path,
        host: &str,
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let verifier = CaFileVerifier::load(ca_file).unwrap();
        let cert = CertificateDer::from_pem_file(presented).unwrap();
        let name = ServerName::try_from(host).unwrap();
        verifier.verify_server_cert(&cert, &[], &name, &[], now)
    }

    fn refused_for(result: Result<ServerCertVerified, rustls::Error>) -> CertificateError {
        match result {
            Err(rustls::Error::InvalidCertificate(e)) => e,
            other => panic!("not refused for its certificate: {other:?}"),
        }
    }

    #[test]
    fn a_pinned_self_signed_ca_certificate_is_accepted_for_the_names_it_carries() {
        let pem = self_signed("pinned");
        let refused = refused_for(
            CaFileVerifier::load(&pem)
                .unwrap()
                .webpki
                .verify_server_cert(
                    &CertificateDer::from_pem_file(&pem).unwrap(),
                    &[],
                    &ServerName::try_from("localhost").unwrap(),
                    &[],
                    UnixTime::now(),
                ),
        );
        assert!(
            matches!(refused, CertificateError::Other(_)),
            "WebPKI alone refuses it as a CA used as an end entity: {refused:?}"
        );
        for host in ["localhost", "127.0.0.1"] {
            let verified = verify(&pem, &pem, host, UnixTime::now());
            assert!(verified.is_ok(), "{host}: {verified:?}");
        }
        let elsewhere = refused_for(verify(&pem, &pem, "example.com", UnixTime::now()));
        assert!(
            matches!(elsewhere, CertificateError::NotValidForNameContext { .. }),
            "{elsewhere:?}"
        );
    }

    #[test]
    fn a_pinned_certificate_is_refused_once_expired() {
        let pem = self_signed("expired");
        let later = UnixTime::now().as_secs() + 3 * 24 * 3600;
        let later = UnixTime::since_unix_epoch(Duration::from_secs(later));
        let refused = refused_for(verify(&pem, &pem, "localhost", later));
        assert!(
            matches!(refused, CertificateError::ExpiredContext { .. }),
            "{refused:?}"
        );
    }

    #[test]
    fn a_self_signed_certificate_not_in_the_ca_file_is_refused() {
        let (pinned, other) = (self_signed("one"), self_signed("two"));
        let refused = verify(&pinned, &other, "localhost", UnixTime::now());
        assert!(refused.is_err(), "{refused:?}");
    }

    #[test]
    fn an_unusable_ca_file_refuses_every_connection_with_why() {
        let connect = CaFileConnect::new(Path::new("/nonexistent/ca.pem"), "localhost");
        let refused = connect.handshake.err().map(|e| e.to_string());
        assert!(
            refused
                .as_ref()
                .is_some_and(|e| e.contains("/nonexistent/ca.pem")),
            "{refused:?}"
        );
    }
}
