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

fn vllm_payloads() -> Vec<Value> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let dir = root.join("target/kv-events");
    let setup = Command::new(root.join("tests/kv_events/setup.sh"))
        .arg(&dir)
        .output()
        .unwrap();
    assert!(
        setup.status.success(),
        "{}",
        String::from_utf8_lossy(&setup.stderr)
    );
    let python = String::from_utf8(setup.stdout).unwrap();
    let run = Command::new(python.trim())
        .arg(root.join("tests/kv_events/payloads.py"))
        .arg(&dir)
        .output()
        .unwrap();
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
