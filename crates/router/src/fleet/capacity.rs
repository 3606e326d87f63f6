//! A backend's KV capacity, read from what vLLM publishes on `/metrics`:
//! `vllm:cache_config_info{block_size="16",num_gpu_blocks="26250",...} 1.0`. The router
//! sizes that backend's prefix index and weighs placements with it; a backend that does
//! not say (another server, an older vLLM) keeps the configured `max_tree_size`.

use std::net::SocketAddr;
use std::time::Duration;

use prefix_router_core::units::Tokens;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Largest `/metrics` page read, bytes.
const MAX_PAGE: u64 = 8 << 20;

/// KV cache tokens in the `vllm:cache_config_info` line of a metrics page, if any.
pub fn parse(page: &str) -> Option<Tokens> {
    let line = page
        .lines()
        .find(|l| l.starts_with("vllm:cache_config_info{"))?;
    let labels = &line[line.find('{')? + 1..line.rfind('}')?];
    let label = |name: &str| -> Option<usize> {
        let pairs = labels.split(',').filter_map(|pair| pair.split_once('='));
        let (_, value) = pairs.into_iter().find(|(key, _)| key.trim() == name)?;
        value.trim().trim_matches('"').parse().ok()
    };
    let tokens = label("block_size")?.checked_mul(label("num_gpu_blocks")?)?;
    (tokens > 0).then_some(Tokens(tokens))
}

/// Reads `GET /metrics` from `addr` (HTTP/1.0, so the answer is not chunked) within
/// `timeout` and returns the KV capacity in tokens, if the page states it.
pub async fn probe(addr: SocketAddr, host: &str, timeout: Duration) -> Option<Tokens> {
    let fetch = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
        let request =
            format!("GET /metrics HTTP/1.0\r\nHost: {host}\r\nAccept: text/plain\r\n\r\n");
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut page = Vec::new();
        stream.take(MAX_PAGE).read_to_end(&mut page).await.ok()?;
        let text = String::from_utf8_lossy(&page);
        let (head, body) = text.split_once("\r\n\r\n")?;
        head.starts_with("HTTP/1.").then_some(())?;
        head.split(' ').nth(1).filter(|s| *s == "200")?;
        parse(body)
    };
    tokio::time::timeout(timeout, fetch).await.ok().flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_vllm_cache_config_info_in_any_label_order() {
        let page = "# HELP x\nvllm:num_requests_running{model_name=\"m\"} 0.0\n\
            vllm:cache_config_info{block_size=\"16\",cache_dtype=\"auto\",enable_prefix_caching=\"True\",num_gpu_blocks=\"26250\",num_cpu_blocks=\"None\"} 1.0\n";
        assert_eq!(parse(page), Some(Tokens(420_000)));
        let reordered =
            "vllm:cache_config_info{num_gpu_blocks=\"10\",engine=\"0\",block_size=\"32\"} 1.0";
        assert_eq!(parse(reordered), Some(Tokens(320)));
        let lookalike =
            "vllm:cache_config_info{kv_block_size=\"8\",block_size=\"16\",num_gpu_blocks=\"2\"} 1";
        assert_eq!(parse(lookalike), Some(Tokens(32)));
    }

    #[test]
    fn pages_without_it_or_with_unknown_blocks_say_nothing() {
        assert_eq!(parse("vllm:num_requests_running 0\n"), None);
        let none = "vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"None\"} 1.0";
        assert_eq!(parse(none), None);
        assert_eq!(parse("vllm:cache_config_info{block_size=\"16\"} 1.0"), None);
    }
}
