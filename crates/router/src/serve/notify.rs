//! systemd integration: `READY=1` on `$NOTIFY_SOCKET` once both listeners accept connections
//! (for `Type=notify` units), `STOPPING=1` when shutdown begins. A no-op outside systemd.

use std::net::{SocketAddr, ToSocketAddrs};
use std::os::unix::net::UnixDatagram;
use std::time::Duration;

use async_trait::async_trait;
use log::{debug, warn};
use pingora_core::server::ShutdownWatch;
use pingora_core::services::background::BackgroundService;

/// Sends `state` to the service manager, if the process runs under one.
pub fn notify(state: &str) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let socket = match UnixDatagram::unbound() {
        Ok(socket) => socket,
        Err(e) => return warn!("cannot notify systemd: {e}"),
    };
    let sent = match path.to_str().and_then(|p| p.strip_prefix('@')) {
        Some(abstract_name) => send_abstract(&socket, abstract_name, state),
        None => socket.send_to(state.as_bytes(), &path).map(drop),
    };
    match sent {
        Ok(()) => debug!("notified systemd: {state}"),
        Err(e) => warn!("cannot notify systemd: {e}"),
    }
}

fn send_abstract(socket: &UnixDatagram, name: &str, state: &str) -> std::io::Result<()> {
    use std::os::linux::net::SocketAddrExt;
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
    socket.send_to_addr(state.as_bytes(), &addr).map(drop)
}

/// Where to connect to check that a listener bound to `listen` accepts.
fn probe_address(listen: &str) -> Option<SocketAddr> {
    let mut addr = listen.to_socket_addrs().ok()?.next()?;
    if addr.ip().is_unspecified() {
        let loopback = if addr.is_ipv4() {
            [127, 0, 0, 1].into()
        } else {
            std::net::Ipv6Addr::LOCALHOST.into()
        };
        addr.set_ip(loopback);
    }
    Some(addr)
}

/// Waits until the listeners accept, then tells systemd the router is ready.
pub struct Readiness {
    /// `host:port` of each listener.
    pub listeners: Vec<String>,
}

#[async_trait]
impl BackgroundService for Readiness {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        for listen in &self.listeners {
            let Some(addr) = probe_address(listen) else {
                continue;
            };
            while tokio::net::TcpStream::connect(addr).await.is_err() {
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(20)) => {}
                    _ = shutdown.changed() => return,
                }
            }
        }
        notify(&format!("READY=1\nMAINPID={}", std::process::id()));
        let _ = shutdown.changed().await;
        notify("STOPPING=1");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unspecified_listeners_are_probed_on_loopback() {
        assert_eq!(
            probe_address("0.0.0.0:8080"),
            Some("127.0.0.1:8080".parse().unwrap())
        );
        assert_eq!(
            probe_address("127.0.0.2:9"),
            Some("127.0.0.2:9".parse().unwrap())
        );
    }
}
