"""Hugging Face's Python `tokenizers` on the text the criterion bench tokenizes (the render
of a new 400 KB conversation, written by `cargo bench -p prefix-router-tokens`): the same
work as the router's `new_400KB_conversation`, minus the render.

Usage: python.py TOKENIZER_DIR TEXT_FILE [RUNS]
"""

import statistics
import sys
import time

from tokenizers import Tokenizer


def main():
    model_dir, text_file = sys.argv[1:3]
    runs = int(sys.argv[3]) if len(sys.argv) > 3 else 20
    tokenizer = Tokenizer.from_file(f"{model_dir}/tokenizer.json")
    text = open(text_file, encoding="utf-8").read()
    tokenizer.encode(text, add_special_tokens=False)  # warm up
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        ids = tokenizer.encode(text, add_special_tokens=False).ids
        times.append((time.perf_counter() - start) * 1000)
    print(f"python tokenizers: {len(text.encode())} bytes, {len(ids)} tokens: "
          f"min {min(times):.1f} ms, median {statistics.median(times):.1f} ms, "
          f"max {max(times):.1f} ms over {runs} runs")


if __name__ == "__main__":
    main()
