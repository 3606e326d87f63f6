"""A tiny Qwen3 model for vLLM on a CPU: random bf16 weights (2 layers, hidden 128, 4 query
heads and 2 KV heads of 32: 512 bytes of KV a token) and the real Qwen3 tokenizer and chat
template, so that prompts are rendered and tokenized as a real Qwen3 deployment's are. Its
outputs are noise; its scheduler, prefix cache, metrics and KV events are vLLM's own.

Usage: python tiny_model.py TOKENIZER_DIR OUT_DIR
(TOKENIZER_DIR holds tokenizer.json and tokenizer_config.json; run in the vLLM venv, which
has torch and transformers.)
"""

import json
import pathlib
import shutil
import sys

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM


def main():
    tokenizer, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
    vocab = json.loads((tokenizer / "tokenizer.json").read_text())
    size = max(vocab["model"]["vocab"].values()) + 1
    size = max([size] + [t["id"] + 1 for t in vocab.get("added_tokens", [])])
    config = Qwen3Config(
        vocab_size=(size + 127) // 128 * 128,
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=131072,
        tie_word_embeddings=True,
        torch_dtype="bfloat16",
        bos_token_id=None,
        eos_token_id=151645,
        pad_token_id=151643,
    )
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config).to(torch.bfloat16)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer / name, out / name)


if __name__ == "__main__":
    main()
