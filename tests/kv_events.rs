//! The router's reading of vLLM's KV events against vLLM's own classes: batches encoded by
//! `vllm/distributed/kv_events.py` (from the vllm wheel, with stubs for its heavy imports;
//! `tests/kv_events/setup.sh`) and by classes declared as older vLLM declared them (the
//! positional encoding), decoded and checked event by event.

use std::path::PathBuf;
use std::process::Command;

use prefix_router_core::events::decode::{self, Event, Medium};
use prefix_router_core::events::held::Held;
use serde_json::Value;
use xxhash_rust::xxh3::xxh3_64;

/// A command running `script` (under tests/kv_events) with the venv `make test-deps` made,
/// its first argument the directory holding vLLM's stubbed `kv_events.py`.
fn vllm_python(script: &str) -> Command {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let (python, dir) = crate::support::fixtures::vllm_kv_events();
    let mut command = Command::new(python);
    command
        .arg(root.join("tests/kv_events").join(script))
        .arg(&dir);
    command
}

fn vllm_payloads() -> Vec<Value> {
    let run = vllm_python("payloads.py").output().unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let lines = String::from_utf8(run.stdout).unwrap();
    lines
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn hex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap())
        .collect()
}

fn medium(name: &Value) -> Medium {
    match name.as_str() {
        Some("CPU") => Medium::Cpu,
        _ => Medium::Gpu,
    }
}

#[test]
fn vllm_batches_decode_event_by_event_in_both_encodings() {
    let cases = vllm_payloads();
    assert_eq!(cases.len(), 4);
    for case in &cases {
        let name = &case["name"];
        let batch = decode::batch(&hex(case["payload"].as_str().unwrap()))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(batch.ts, case["ts"].as_f64().unwrap(), "{name}");
        let want = case["events"].as_array().unwrap();
        assert_eq!(batch.events.len(), want.len(), "{name}");
        for (got, want) in batch.events.iter().zip(want) {
            let hashes = |h: &[u64]| match want["hashes"].as_array() {
                Some(ints) => assert_eq!(
                    h,
                    ints.iter().map(|v| v.as_u64().unwrap()).collect::<Vec<_>>(),
                    "{name}"
                ),
                None => assert_eq!(h.len() as u64, want["count"].as_u64().unwrap(), "{name}"),
            };
            match (got, want["type"].as_str().unwrap()) {
                (Event::Stored(s), "BlockStored") => {
                    hashes(&s.hashes);
                    assert_eq!(
                        s.token_ids.len() as u64,
                        want["tokens"].as_u64().unwrap(),
                        "{name}"
                    );
                    assert_eq!(
                        (s.medium, s.keyed),
                        (medium(&want["medium"]), want["keyed"].as_bool().unwrap()),
                        "{name}"
                    );
                    assert_eq!(s.group, want["group"].as_u64(), "{name}");
                    if let Some(parent) = want["parent"].as_u64() {
                        assert_eq!(s.parent, Some(parent), "{name}");
                    }
                }
                (Event::Removed(r), "BlockRemoved") => {
                    hashes(&r.hashes);
                    assert_eq!(r.medium, medium(&want["medium"]), "{name}");
                    assert_eq!(r.group, want["group"].as_u64(), "{name}");
                }
                (Event::Cleared, "AllBlocksCleared") => {}
                (got, want) => panic!("{name}: decoded {got:?}, vLLM wrote {want}"),
            }
        }
    }
    // Hashes published as bytes are named by a hash of the bytes, consistently.
    let bytes = cases.iter().find(|c| c["name"] == "bytes_hashes").unwrap();
    let batch = decode::batch(&hex(bytes["payload"].as_str().unwrap())).unwrap();
    let (Event::Stored(s), Event::Removed(r)) = (&batch.events[0], &batch.events[1]) else {
        panic!()
    };
    assert_eq!(
        (s.hashes[1], r.hashes[0]),
        (xxh3_64(&[2; 32]), xxh3_64(&[2; 32]))
    );
}

#[test]
fn vllm_batches_applied_leave_what_the_engine_holds() {
    let cases = vllm_payloads();
    let current = cases.iter().find(|c| c["name"] == "current").unwrap();
    let batch = decode::batch(&hex(current["payload"].as_str().unwrap())).unwrap();
    let mut held = Held::new(16, 1000).unwrap();
    held.apply(&batch.events[0]);
    assert_eq!(held.len(), 2);
    held.apply(&batch.events[1]);
    held.apply(&batch.events[2]);
    assert_eq!(held.len(), 2, "12 removed, 13 stored after it");
    held.apply(&batch.events[3]);
    assert!(held.is_empty());
}

/// vLLM's publisher in a child process, driven line by line.
struct ZmqPublisher {
    child: std::process::Child,
    input: std::process::ChildStdin,
    output: std::io::Lines<std::io::BufReader<std::process::ChildStdout>>,
}

impl ZmqPublisher {
    fn start(pub_port: u16, replay_port: Option<u16>) -> ZmqPublisher {
        use std::io::BufRead;
        let mut command = vllm_python("publisher.py");
        command.arg(pub_port.to_string());
        if let Some(port) = replay_port {
            command.arg(port.to_string());
        }
        let mut child = command
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let input = child.stdin.take().unwrap();
        let mut output = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
        assert_eq!(output.next().unwrap().unwrap(), "ready");
        ZmqPublisher {
            child,
            input,
            output,
        }
    }

    fn send(&mut self, op: serde_json::Value) {
        use std::io::Write;
        writeln!(self.input, "{op}").unwrap();
        assert_eq!(self.output.next().unwrap().unwrap(), "ok");
    }
}

impl Drop for ZmqPublisher {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn port() -> u16 {
    crate::support::free_loopback_addr()
        .unwrap()
        .rsplit_once(':')
        .unwrap()
        .1
        .parse()
        .unwrap()
}

fn prompt(blocks: u32) -> Vec<u32> {
    (0..blocks * 16).map(|i| 5000 + i).collect()
}

fn chain(ids: &[u32]) -> Vec<[u8; 8]> {
    prefix_router_tokens::encode::chain_of_ids(ids).chain
}

/// Waits (bounded) until `check` holds.
async fn until(what: &str, mut check: impl FnMut() -> bool) {
    for _ in 0..200 {
        if check() {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    panic!("timed out waiting for {what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_record_follows_vllms_publisher_and_fills_gaps_from_its_replay_socket() {
    use prefix_router::kv_events::{self, Record, Subscription};
    use serde_json::json;
    use std::sync::Arc;
    use std::sync::atomic::Ordering::Relaxed;
    let (pub_port, replay_port) = (port(), port());
    let mut publisher = ZmqPublisher::start(pub_port, Some(replay_port));
    let record = Arc::new(Record::new(16, 100_000).unwrap());
    let subscription = Subscription {
        endpoint: format!("tcp://127.0.0.1:{pub_port}"),
        replay: Some(format!("tcp://127.0.0.1:{replay_port}")),
        topic: String::new(),
    };
    let task = tokio::spawn(kv_events::run(subscription, Arc::clone(&record)));
    let ids = prompt(4);
    // The first batches may go out before the subscription is in place (ZMQ's slow
    // joiner): the first one received then shows a gap, filled from the replay socket.
    publisher.send(json!({"op": "store", "hashes": [1, 2], "tokens": ids[..32]}));
    publisher.send(json!({"op": "store", "hashes": [3], "parent": 2, "tokens": ids[32..48]}));
    until("the stored blocks", || {
        record.matched(&chain(&ids)) == (48, 48)
    })
    .await;
    publisher.send(json!({"op": "remove", "hashes": [2]}));
    until("the removal", || record.matched(&chain(&ids)) == (16, 16)).await;

    // A batch lost on the PUB socket: the next one shows the gap, the replay fills it.
    publisher.send(json!({"op": "lose", "hashes": [12], "parent": 1, "tokens": ids[16..32]}));
    publisher.send(json!({"op": "store", "hashes": [14], "parent": 3, "tokens": ids[48..64]}));
    until("the replayed block", || {
        record.matched(&chain(&ids)) == (64, 64)
    })
    .await;
    assert!(record.counts.replays.load(Relaxed) >= 1);
    assert!(!record.degraded());
    publisher.send(json!({"op": "clear"}));
    until("the clear", || record.blocks() == 0).await;
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_replay_socket_a_gap_degrades_the_record_until_the_engine_clears() {
    use prefix_router::kv_events::{self, Record, Subscription};
    use serde_json::json;
    use std::sync::Arc;
    let pub_port = port();
    let mut publisher = ZmqPublisher::start(pub_port, None);
    let record = Arc::new(Record::new(16, 100_000).unwrap());
    let subscription = Subscription {
        endpoint: format!("tcp://127.0.0.1:{pub_port}"),
        replay: None,
        topic: String::new(),
    };
    let task = tokio::spawn(kv_events::run(subscription, Arc::clone(&record)));
    let ids = prompt(2);
    // Sent until the subscriber is in place and has it.
    until("a first batch", || {
        publisher.send(json!({"op": "store", "hashes": [1], "tokens": ids[..16]}));
        record.blocks() > 0
    })
    .await;
    publisher.send(json!({"op": "lose", "hashes": [2], "parent": 1, "tokens": ids[16..32]}));
    publisher.send(json!({"op": "store", "hashes": [3], "tokens": ids[..16]}));
    until("the gap", || record.degraded()).await;
    publisher.send(json!({"op": "clear"}));
    until("the clear", || !record.degraded() && record.blocks() == 0).await;
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_the_engine_holds_by_its_events_routes_there_and_explain_shows_it() {
    use crate::support::*;
    use prefix_router::config::Settings;
    use prefix_router_core::request::Endpoint;
    use serde_json::json;
    let tokenizer = fixtures::tokenizer("qwen3");
    let model = prefix_router_tokens::Model::load(&tokenizer).expect("Qwen3's tokenizer loads");
    let ups = [
        TestUpstream::start("a").await,
        TestUpstream::start("b").await,
    ];
    let (pub_port, replay_port) = (port(), port());
    let mut publisher = ZmqPublisher::start(pub_port, Some(replay_port));
    let offset = i32::from(pub_port) - i32::from(ups[0].addr.port());
    let template = format!("tcp://127.0.0.1:{{port{offset:+}}}");
    let router = TestRouter::start(
        Settings {
            tokenizer: Some(tokenizer),
            kv_events: Some(template),
            ..settings(&[&ups[0], &ups[1]])
        },
        2,
    );
    let body = json!({"model": "qwen3", "max_tokens": 4, "messages": [
        {"role": "system", "content": "You answer about build systems. ".repeat(40)},
        {"role": "user", "content": "why does the linker fail? ".repeat(30)}]});
    let bytes = serde_json::to_vec(&body).unwrap();
    let explain = || async {
        let resp = client()
            .post(format!("{}/route", router.admin_url))
            .body(bytes.clone())
            .send()
            .await
            .unwrap();
        resp.json::<Value>().await.unwrap()
    };
    let a_record = |why: &Value| {
        why["backends"]
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["url"] == ups[0].url())
            .map(|b| b["record"].clone())
            .unwrap_or_default()
    };
    for _ in 0..200 {
        if a_record(&explain().await)["mode"] == "exact" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    assert_eq!(a_record(&explain().await)["mode"], "exact");

    // Backend a's engine holds the prompt (traffic that did not pass this router).
    let prompt = model.renderer().prompt(Endpoint::Chat, &bytes).unwrap();
    let ids = model.ids(&prompt).unwrap();
    let blocks = ids.len() / 16;
    let hashes: Vec<u64> = (1..=blocks as u64).collect();
    publisher.send(json!({"op": "store", "hashes": hashes, "tokens": ids[..blocks * 16]}));
    let mut why = explain().await;
    for _ in 0..200 {
        if a_record(&why)["gpu_tokens"] == blocks * 16 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
        why = explain().await;
    }
    assert_eq!(a_record(&why)["gpu_tokens"], blocks * 16, "{why}");
    assert_eq!(why["backend"], ups[0].url(), "{why}");
    assert_eq!(why["matched_tokens"], blocks * 16, "{why}");
    let (status, reply) = post(&router.url, "/v1/chat/completions", &body).await;
    assert_eq!(
        (status, reply["backend"].as_str()),
        (200, Some("a")),
        "{reply}"
    );
    let scrape = router.metrics().await;
    let a = ups[0].url();
    let stored = [("backend", a.as_str()), ("type", "stored")];
    assert_eq!(sum(&scrape, "prefix_router_kv_events_total", &stored), 1.0);
    let gpu = [("backend", a.as_str()), ("medium", "gpu")];
    assert_eq!(
        sum(&scrape, "prefix_router_kv_event_blocks", &gpu),
        blocks as f64
    );
    let exact = [("backend", a.as_str()), ("mode", "exact")];
    assert_eq!(sum(&scrape, "prefix_router_kv_event_record", &exact), 1.0);

    // Evicted there: the record says so at once.
    publisher.send(json!({"op": "remove", "hashes": hashes}));
    for _ in 0..200 {
        if a_record(&explain().await)["gpu_tokens"] == 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    assert_eq!(a_record(&explain().await)["gpu_tokens"], 0);

    // Its health checks fail (a restart, perhaps): not trusted until its next batch says
    // its numbers go on, and then what it stored before is still there.
    publisher.send(json!({"op": "store", "hashes": hashes, "tokens": ids[..blocks * 16]}));
    for _ in 0..200 {
        if a_record(&explain().await)["gpu_tokens"] == blocks * 16 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    ups[0].set_healthy(false);
    let degraded = [("backend", a.as_str()), ("mode", "degraded")];
    for _ in 0..200 {
        if sum(
            &router.metrics().await,
            "prefix_router_kv_event_record",
            &degraded,
        ) == 1.0
        {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    let scrape = router.metrics().await;
    assert_eq!(
        sum(&scrape, "prefix_router_kv_event_record", &degraded),
        1.0
    );
    ups[0].set_healthy(true);
    for _ in 0..200 {
        if a_record(&explain().await)["mode"] == "degraded" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    assert_eq!(
        a_record(&explain().await)["mode"],
        "degraded",
        "healthy, not yet trusted"
    );
    publisher.send(json!({"op": "remove", "hashes": [999_999]}));
    for _ in 0..200 {
        if a_record(&explain().await)["mode"] == "exact" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    let why = explain().await;
    assert_eq!(a_record(&why)["mode"], "exact", "{why}");
    assert_eq!(a_record(&why)["gpu_tokens"], blocks * 16, "{why}");
}

/// A batch as vLLM writes it: `[ts, [events], 0]`, events as maps.
fn batch_payload(events: &[serde_json::Value]) -> Vec<u8> {
    fn write(v: &serde_json::Value, out: &mut Vec<u8>) {
        match v {
            Value::Null => out.push(0xc0),
            Value::Bool(b) => out.push(if *b { 0xc3 } else { 0xc2 }),
            Value::Number(n) => match n.as_u64() {
                Some(u) => {
                    out.push(0xcf);
                    out.extend(u.to_be_bytes());
                }
                None => {
                    out.push(0xcb);
                    out.extend(n.as_f64().unwrap_or(0.0).to_bits().to_be_bytes());
                }
            },
            Value::String(s) => {
                out.push(0xdb);
                out.extend((s.len() as u32).to_be_bytes());
                out.extend(s.as_bytes());
            }
            Value::Array(items) => {
                out.push(0xdd);
                out.extend((items.len() as u32).to_be_bytes());
                items.iter().for_each(|i| write(i, out));
            }
            Value::Object(map) => {
                out.push(0xdf);
                out.extend((map.len() as u32).to_be_bytes());
                for (k, v) in map {
                    write(&Value::String(k.clone()), out);
                    write(v, out);
                }
            }
        }
    }
    let mut out = Vec::new();
    write(&serde_json::json!([1.0, events, 0]), &mut out);
    out
}

fn store(hashes: &[u64], tokens: &[u32]) -> serde_json::Value {
    serde_json::json!({"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": null,
        "token_ids": tokens, "block_size": 16, "lora_id": null, "medium": "GPU", "lora_name": null})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_streams_never_crash_the_record_nor_grow_it_past_its_bound() {
    use bytes::Bytes;
    use prefix_router::kv_events::{self, Record, Subscription};
    use std::sync::Arc;
    use std::sync::atomic::Ordering::Relaxed;
    use zeromq::{Socket, SocketSend, ZmqMessage};
    let address = crate::support::free_loopback_addr().unwrap();
    let mut publisher = zeromq::PubSocket::new();
    publisher.bind(&format!("tcp://{address}")).await.unwrap();
    let record = Arc::new(Record::new(16, 1000).unwrap());
    let subscription = Subscription {
        endpoint: format!("tcp://{address}"),
        replay: None,
        topic: String::new(),
    };
    let task = tokio::spawn(kv_events::run(subscription, Arc::clone(&record)));
    let send = |frames: Vec<Vec<u8>>| {
        let mut message = ZmqMessage::from(Bytes::new());
        frames
            .into_iter()
            .for_each(|f| message.push_back(Bytes::from(f)));
        message
    };
    let ids = prompt(1);
    // Sent until the subscriber is in place and has a first batch.
    for seq in 0..200u64 {
        publisher
            .send(send(vec![
                seq.to_be_bytes().to_vec(),
                batch_payload(&[store(&[seq + 1], &ids)]),
            ]))
            .await
            .unwrap();
        if record.blocks() > 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    assert!(record.blocks() > 0, "the subscriber never got a batch");
    let next = record.counts.batches.load(Relaxed) + 1000;
    let mut seq = next;
    let mut frames = |payload: Vec<u8>| {
        seq += 1;
        send(vec![seq.to_be_bytes().to_vec(), payload])
    };
    // Garbage of every kind: one frame, a short sequence number, not MessagePack,
    // truncated MessagePack, an unknown event type, a list claiming a million blocks.
    publisher
        .send(ZmqMessage::from(Bytes::from_static(b"x")))
        .await
        .unwrap();
    publisher
        .send(send(vec![vec![1, 2, 3], b"payload".to_vec()]))
        .await
        .unwrap();
    publisher
        .send(frames(b"not msgpack".to_vec()))
        .await
        .unwrap();
    let whole = batch_payload(&[store(&[7], &ids)]);
    publisher
        .send(frames(whole[..whole.len() / 2].to_vec()))
        .await
        .unwrap();
    publisher
        .send(frames(batch_payload(&[
            serde_json::json!({"type": "BlockMoved"}),
        ])))
        .await
        .unwrap();
    let mut million = vec![0x93, 0xcb];
    million.extend(1.0f64.to_bits().to_be_bytes());
    million.extend([0x91, 0xdd, 0x00, 0x0f, 0x42, 0x40]);
    publisher.send(frames(million)).await.unwrap();
    // A flood: 100,000 events (1,000 batches of 100 stores), far past the record's bound.
    for b in 0..1000u64 {
        let events: Vec<_> = (0..100)
            .map(|e| store(&[1_000_000 + b * 100 + e], &ids))
            .collect();
        publisher
            .send(frames(batch_payload(&events)))
            .await
            .unwrap();
    }
    until("the flood", || {
        record.counts.events[0].load(Relaxed) >= 10_000
    })
    .await;
    assert!(record.blocks() <= 1000, "{} blocks", record.blocks());
    assert!(record.degraded(), "past its bound the record is not whole");
    assert!(record.counts.decode_failures.load(Relaxed) >= 3);
    assert!(
        record.counts.events[3].load(Relaxed) >= 1,
        "the unknown type counted"
    );
    // Numbers going back: the publisher restarted; the record starts over, whole.
    publisher
        .send(send(vec![
            0u64.to_be_bytes().to_vec(),
            batch_payload(&[store(&[5], &ids)]),
        ]))
        .await
        .unwrap();
    until("the restart", || record.blocks() == 1 && !record.degraded()).await;
    task.abort();
}
