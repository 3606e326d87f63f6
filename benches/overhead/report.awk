# Reads run.sh's result lines ("name kb conns ticks clk_tck rss_kb idle_rss_kb {json}") and
# prints one row per run, with the router's CPU and p99 as ratios to the nginx run and to
# the Pingora pass-through run just before it; a traced router's also to the untraced one,
# the TLS router's to nginx over TLS, and Envoy with the endpoint picker's to the router.
function field(key,   m) {
  if (match($0, "\"" key "\":[0-9.]+")) return substr($0, RSTART + length(key) + 3, RLENGTH - length(key) - 3)
  return 0
}
BEGIN {
  printf "%-7s %7s %5s %9s %9s %9s %10s %9s %9s %7s %34s\n", "forward", "body", "conns",
    "req/s", "p50", "p99", "CPU/req", "RSS idle", "RSS load", "errors", "router: x nginx, x pingora"
}
{
  reqs = field("requests"); secs = field("seconds")
  rate = reqs / secs; cpu = $4 * 1e6 / $5 / reqs
  p50 = field("p50_us") / 1000; p99 = field("p99_us") / 1000
  ratio = ""
  if ($1 == "router") { r_cpu = cpu; r_p99 = p99 }
  if ($1 ~ /^traced/ && r_cpu > 0) ratio_router = sprintf(" (x router: cpu %.2fx, p99 %.2fx)", cpu / r_cpu, p99 / r_p99)
  else ratio_router = ""
  if ($1 == "nginx-tls") { t_cpu = cpu; t_p99 = p99 }
  if ($1 == "router-tls" && t_cpu > 0) ratio_router = sprintf(" (x nginx-tls: cpu %.2fx, p99 %.2fx)", cpu / t_cpu, p99 / t_p99)
  if ($1 == "envoy-epp" && r_cpu > 0) ratio_router = sprintf(" (x router: cpu %.2fx, p99 %.2fx)", cpu / r_cpu, p99 / r_p99)
  if ($1 == "nginx") { n_cpu = cpu; n_p99 = p99; n_rate = rate }
  else if ($1 == "pingora") { p_cpu = cpu; p_p99 = p99 }
  else if (n_cpu > 0 && p_cpu > 0) ratio = sprintf("cpu %.2fx %.2fx, p99 %.2fx %.2fx", cpu / n_cpu, cpu / p_cpu, p99 / n_p99, p99 / p_p99)
  printf "%-7s %5d KB %5d %9.0f %7.2fms %7.2fms %8.1fus %6.1f MB %6.1f MB %7d %34s%s\n", $1, $2, $3,
    rate, p50, p99, cpu, $7 / 1024, $6 / 1024, field("errors"), ratio, ratio_router
}
