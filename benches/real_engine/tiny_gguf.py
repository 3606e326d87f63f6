"""A tiny model for llama.cpp: random weights (llama architecture, a few layers, small
width) and a real tokenizer (a Hugging Face tokenizer.json of byte-level BPE, with its
tokenizer_config.json's chat template), written with the `gguf` writer that ships in
llama.cpp's own source (gguf-py). Its outputs are noise; its prefix cache, tokens and
timing are a real engine's.

Usage: python tiny_gguf.py TOKENIZER_DIR OUT.gguf [--layers N] [--width N] [--context N]
(run with llama.cpp's gguf-py on PYTHONPATH and numpy installed).
"""

import argparse
import json
import pathlib

import numpy as np
import gguf


def tokenizer(writer, directory):
    data = json.loads((directory / "tokenizer.json").read_text())
    config = json.loads((directory / "tokenizer_config.json").read_text())
    model = data["model"]
    if model["type"] != "BPE":
        raise SystemExit(f"{directory}: a BPE tokenizer is needed, not {model['type']}")
    vocab = dict(model["vocab"])
    added = {t["content"]: t for t in data.get("added_tokens", [])}
    for content, token in added.items():
        vocab[content] = token["id"]
    size = max(vocab.values()) + 1
    tokens = [f"[PAD{i}]" for i in range(size)]
    types = [gguf.TokenType.UNUSED] * size
    for text, i in vocab.items():
        tokens[i] = text
        types[i] = gguf.TokenType.NORMAL
    for content, token in added.items():
        special = token.get("special", False)
        types[token["id"]] = gguf.TokenType.CONTROL if special else gguf.TokenType.USER_DEFINED
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    eos = config.get("eos_token")
    eos = eos.get("content") if isinstance(eos, dict) else eos
    if eos in vocab:
        writer.add_eos_token_id(vocab[eos])
    pad = config.get("pad_token")
    pad = pad.get("content") if isinstance(pad, dict) else pad
    if pad in vocab:
        writer.add_pad_token_id(vocab[pad])
        writer.add_bos_token_id(vocab[pad])
    writer.add_add_bos_token(bool(config.get("add_bos_token", False)))
    if config.get("chat_template"):
        writer.add_chat_template(config["chat_template"])
    return size


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("tokenizer", type=pathlib.Path)
    parser.add_argument("out", type=pathlib.Path)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--context", type=int, default=131072)
    args = parser.parse_args()
    writer = gguf.GGUFWriter(str(args.out), "llama")
    writer.add_name("tiny-random")
    vocab = tokenizer(writer, args.tokenizer)
    width, heads, ffn = args.width, args.heads, args.width * 4
    writer.add_vocab_size(vocab)
    writer.add_context_length(args.context)
    writer.add_embedding_length(width)
    writer.add_block_count(args.layers)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(heads)
    writer.add_rope_dimension_count(width // heads)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    rng = np.random.default_rng(0)

    def tensor(name, *shape):
        writer.add_tensor(name, (rng.standard_normal(shape) * 0.02).astype(np.float32))

    tensor("token_embd.weight", vocab, width)
    writer.add_tensor("output_norm.weight", np.ones(width, dtype=np.float32))
    tensor("output.weight", vocab, width)
    for b in range(args.layers):
        writer.add_tensor(f"blk.{b}.attn_norm.weight", np.ones(width, dtype=np.float32))
        writer.add_tensor(f"blk.{b}.ffn_norm.weight", np.ones(width, dtype=np.float32))
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            tensor(f"blk.{b}.{name}.weight", width, width)
        tensor(f"blk.{b}.ffn_gate.weight", ffn, width)
        tensor(f"blk.{b}.ffn_up.weight", ffn, width)
        tensor(f"blk.{b}.ffn_down.weight", width, ffn)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    print(f"{args.out}: vocab {vocab}, {args.layers} layers of width {width}")


if __name__ == "__main__":
    main()
