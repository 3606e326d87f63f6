//! `prefix-router-passthrough --listen 127.0.0.1:PORT --upstreams 127.0.0.1:A,127.0.0.1:B
//! [--threads N]`: proxies every request to the upstreams in turn with Pingora's own
//! machinery (bodies streamed, pooled upstream connections), and nothing else. For
//! `benches/overhead/run.sh`: what any Pingora-based proxy costs at least.

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use async_trait::async_trait;
use pingora_core::server::Server;
use pingora_core::server::configuration::ServerConf;
use pingora_core::upstreams::peer::HttpPeer;
use pingora_proxy::{ProxyHttp, Session};

struct Passthrough {
    upstreams: Vec<String>,
    next: AtomicUsize,
}

#[async_trait]
impl ProxyHttp for Passthrough {
    type CTX = ();

    fn new_ctx(&self) {}

    async fn upstream_peer(
        &self,
        _: &mut Session,
        _: &mut (),
    ) -> pingora_core::Result<Box<HttpPeer>> {
        let turn = self.next.fetch_add(1, Relaxed) % self.upstreams.len();
        Ok(Box::new(HttpPeer::new(
            self.upstreams[turn].as_str(),
            false,
            String::new(),
        )))
    }
}

fn flag(args: &[String], name: &str) -> Option<String> {
    let at = args.iter().position(|a| a == name)?;
    args.get(at + 1).cloned()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let usage =
        "usage: prefix-router-passthrough --listen ADDR --upstreams ADDR[,ADDR...] [--threads N]";
    let (Some(listen), Some(upstreams)) = (flag(&args, "--listen"), flag(&args, "--upstreams"))
    else {
        eprintln!("{usage}");
        std::process::exit(2);
    };
    let threads = flag(&args, "--threads")
        .and_then(|t| t.parse().ok())
        .unwrap_or(1);
    let conf = ServerConf {
        threads,
        upstream_keepalive_pool_size: 1024,
        ..ServerConf::default()
    };
    let mut server = Server::new_with_opt_and_conf(None, conf);
    server.bootstrap();
    let proxy = Passthrough {
        upstreams: upstreams.split(',').map(str::to_string).collect(),
        next: AtomicUsize::new(0),
    };
    let mut service = pingora_proxy::http_proxy_service(&server.configuration, proxy);
    service.add_tcp(&listen);
    server.add_service(service);
    server.run_forever()
}
