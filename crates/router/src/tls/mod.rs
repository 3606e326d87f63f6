//! TLS on both sides of the router, with rustls (Pingora's `rustls` feature, which builds
//! with a C compiler alone, where boringssl needs libclang and openssl a system or vendored
//! OpenSSL).
//!
//! - **Listeners.** The data listener, and the admin listener with its own pair, serve TLS
//!   when given a PEM certificate chain and key. HTTP/2 is offered by ALPN beside HTTP/1.1.
//!   The pair is read again on every reload (SIGHUP, `POST /reload`): new handshakes get
//!   the new certificate, open connections keep theirs, and a pair that cannot be read
//!   leaves the old one serving.
//! - **Upstreams.** An `https://` worker is reached over TLS with SNI from its host,
//!   verified against `upstream_ca_file` (else the system's roots), or not verified at all
//!   with `upstream_tls_insecure` (test fleets only). Relayed exchanges, health checks and
//!   the metrics and models readers all connect with the backend's one peer.
//! - **Pinned upstream certificates** ([`pinned`]): a certificate in `upstream_ca_file`
//!   that is byte for byte the one a worker presents is accepted even when it is marked as
//!   a CA.

mod pinned;

pub use pinned::{CaFileConnect, CaFileVerifier};

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arc_swap::ArcSwap;
use pingora_core::listeners::tls::TlsSettings as ListenerTls;
use pingora_core::tls::sign::CertifiedKey;
use pingora_core::tls::{ClientHello, CryptoProvider, ResolvesServerCert};
use pingora_core::upstreams::peer::{HttpPeer, Scheme};

/// A certificate chain and its private key, PEM files.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertFiles {
    /// The chain, leaf first (`tls_cert_file`).
    pub cert: PathBuf,
    /// The leaf's private key: PKCS#8, PKCS#1 or SEC1 (`tls_key_file`).
    pub key: PathBuf,
}

/// TLS settings of the listeners and the upstreams. Default: plain HTTP everywhere,
/// `https://` workers verified against the system's roots.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsConfig {
    /// The data listener's pair (`tls_cert_file`, `tls_key_file`); none: plain HTTP.
    pub listener: Option<CertFiles>,
    /// The admin listener's pair (`admin_tls_cert_file`, `admin_tls_key_file`); none:
    /// plain HTTP.
    pub admin: Option<CertFiles>,
    /// How `https://` workers are verified.
    pub upstream: UpstreamTls,
}

/// How `https://` workers are verified.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UpstreamTls {
    /// PEM CA certificates that sign the workers' certificates, in place of the system's
    /// roots (`upstream_ca_file`). Default none: the system's roots.
    pub ca_file: Option<PathBuf>,
    /// Accept any certificate and name (`upstream_tls_insecure`). Default false.
    pub insecure: bool,
}

/// A certificate pair that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("cannot read {path}: {cause}")]
    Read { path: String, cause: std::io::Error },
    /// The files hold no PEM certificate or no PEM private key.
    #[error("{cert} and {key} do not hold a PEM certificate and a PEM private key")]
    Pem { cert: String, key: String },
    /// The key is not one rustls signs with, or does not match the certificate.
    #[error("the key in {key} cannot be used: {cause}")]
    Key { key: String, cause: String },
    /// The upstream CA file holds no certificate, or one rustls cannot trust.
    #[error("{path} cannot be used as a CA file: {cause}")]
    CaFile { path: String, cause: String },
    /// A worker's host is neither a DNS name nor an IP address a certificate can name.
    #[error("{host} cannot be verified: {cause}")]
    Host { host: String, cause: String },
}

/// Installs rustls's process-wide crypto provider (ring). Idempotent; called before any
/// TLS configuration is built.
pub fn install_provider() {
    pingora_core::tls::install_default_crypto_provider();
}

/// A listener's certificate, swapped whole on reload.
#[derive(Debug)]
pub struct Certificate {
    files: CertFiles,
    current: ArcSwap<CertifiedKey>,
}

impl Certificate {
    /// Reads the pair.
    pub fn load(files: CertFiles) -> Result<Arc<Certificate>, TlsError> {
        let current = ArcSwap::from_pointee(read_pair(&files)?);
        Ok(Arc::new(Certificate { files, current }))
    }

    /// Reads the pair again; on error the old one keeps serving.
    pub fn reload(&self) -> Result<(), TlsError> {
        self.current.store(Arc::new(read_pair(&self.files)?));
        Ok(())
    }

    /// Listener settings serving this certificate, HTTP/2 offered by ALPN.
    pub fn listener(self: &Arc<Self>) -> ListenerTls {
        let path = |p: &Path| p.display().to_string();
        // Only stores the paths; the resolver takes their place when the acceptor is built.
        let mut settings =
            ListenerTls::intermediate(&path(&self.files.cert), &path(&self.files.key))
                .unwrap_or_else(|_| {
                    unreachable!("intermediate() stores the paths and cannot fail")
                });
        settings.set_cert_resolver(Arc::clone(self) as Arc<dyn ResolvesServerCert>);
        settings.enable_h2();
        settings
    }
}

impl ResolvesServerCert for Certificate {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.load_full())
    }
}

fn read_pair(files: &CertFiles) -> Result<CertifiedKey, TlsError> {
    let (cert, key) = (files.cert.display(), files.key.display());
    for path in [&files.cert, &files.key] {
        std::fs::metadata(path).map_err(|cause| TlsError::Read {
            path: path.display().to_string(),
            cause,
        })?;
    }
    let pem = || TlsError::Pem {
        cert: cert.to_string(),
        key: key.to_string(),
    };
    let (chain, private) =
        pingora_core::tls::load_certs_and_key_files(&cert.to_string(), &key.to_string())
            .map_err(|_| pem())?
            .ok_or_else(pem)?;
    let key_error = |cause: String| TlsError::Key {
        key: key.to_string(),
        cause,
    };
    let provider = provider().ok_or_else(|| key_error("no provider".into()))?;
    let chain = chain.into_iter().map(|c| c.into_owned()).collect();
    CertifiedKey::from_der(chain, private.clone_key(), &provider)
        .map_err(|e| key_error(e.to_string()))
}

impl UpstreamTls {
    /// Sets `peer` to reach the worker at `host` over TLS, verified as configured: with a
    /// CA file (and not insecure), through a [`CaFileConnect`] for `host`, which reads the
    /// CA file now (a file that cannot be used refuses every connection, with why);
    /// otherwise with Pingora's own TLS.
    pub fn apply(&self, peer: &mut HttpPeer, host: &str) {
        // The SNI also keeps the peer's pooled connections apart from any other's: it is
        // part of Pingora's reuse hash, whatever the scheme.
        peer.sni = host.to_string();
        if let (Some(ca_file), false) = (&self.ca_file, self.insecure) {
            // The stream the connector returns is TLS already: Pingora must not add its own.
            peer.scheme = Scheme::HTTP;
            peer.options.custom_l4 = Some(Arc::new(CaFileConnect::new(ca_file, host)));
            return;
        }
        peer.scheme = Scheme::HTTPS;
        peer.options.verify_cert = !self.insecure;
        peer.options.verify_hostname = !self.insecure;
    }

    /// The connector options that carry the CA file; `None` (the defaults) without one.
    /// Pingora's TLS never verifies with it (the peers that trust it connect through a
    /// [`CaFileConnect`]); it spares Pingora loading the system's roots for nothing.
    pub fn connector(&self) -> Option<pingora_core::connectors::ConnectorOptions> {
        let ca_file = self.ca_file.as_ref()?.display().to_string();
        let mut options = pingora_core::connectors::ConnectorOptions::new(CONNECTOR_POOL);
        options.ca_file = Some(ca_file);
        Some(options)
    }
}

/// Idle connections a connector keeps, as Pingora's default connector.
const CONNECTOR_POOL: usize = 128;

/// rustls's process-wide crypto provider, installed if need be.
pub(crate) fn provider() -> Option<Arc<CryptoProvider>> {
    install_provider();
    CryptoProvider::get_default().cloned()
}

/// The listeners' certificates, read again together on reload.
#[derive(Clone, Debug, Default)]
pub struct Certificates {
    /// The data listener's, if it serves TLS.
    pub listener: Option<Arc<Certificate>>,
    /// The admin listener's, if it serves TLS.
    pub admin: Option<Arc<Certificate>>,
}

impl Certificates {
    /// Reads the pairs `config` names.
    pub fn load(config: &TlsConfig) -> Result<Certificates, TlsError> {
        let load = |files: &Option<CertFiles>| files.clone().map(Certificate::load).transpose();
        Ok(Certificates {
            listener: load(&config.listener)?,
            admin: load(&config.admin)?,
        })
    }

    /// Whether any listener serves TLS.
    pub fn any(&self) -> bool {
        self.listener.is_some() || self.admin.is_some()
    }

    /// Reads every pair again; one that fails keeps its old certificate and is returned.
    pub fn reload(&self) -> Result<(), TlsError> {
        let all = self.listener.iter().chain(&self.admin);
        let results: Vec<_> = all.map(|c| c.reload()).collect();
        results.into_iter().collect()
    }
}
