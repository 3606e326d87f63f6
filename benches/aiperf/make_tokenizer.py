"""Builds a byte-level BPE tokenizer locally (no hub access), trained on the Shakespeare corpus
that the aiperf wheel ships for prompt synthesis, and installs it in a Hugging Face cache
layout (HF_HOME/hub/models--local--sim-tokenizer/snapshots/<rev>/) so that aiperf can load it
as `--tokenizer local/sim-tokenizer` with HF_HUB_OFFLINE=1 (aiperf's worker processes force
offline mode, where a plain directory path is not accepted)."""
import os, sys, importlib.resources as ir
from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers
from transformers import PreTrainedTokenizerFast
hf_home, vocab = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 16000
corpus = (ir.files("aiperf.dataset.generator") / "assets" / "shakespeare.txt").read_text()
lines = [l for l in corpus.splitlines() if l.strip()]
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
tok.train_from_iterator(lines, trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<|endoftext|>"],
                                                   initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
rev = "0" * 40
snap = os.path.join(hf_home, "hub", "models--local--sim-tokenizer", "snapshots", rev)
os.makedirs(snap, exist_ok=True)
PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", bos_token="<|endoftext|>",
                        unk_token="<|endoftext|>").save_pretrained(snap)
refs = os.path.join(hf_home, "hub", "models--local--sim-tokenizer", "refs")
os.makedirs(refs, exist_ok=True)
open(os.path.join(refs, "main"), "w").write(rev)
sample = corpus[:200000]
n = len(tok.encode(sample).ids)
print(f"saved {snap}: vocab {tok.get_vocab_size()}, {len(sample.encode()) / n:.2f} bytes/token on the corpus")
