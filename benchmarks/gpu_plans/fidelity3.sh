# Fifth GPU session (2026-12-02): the client's fidelity with both clients sending the very same
# prompts, each making them itself: vllm bench serve's random dataset and Quantdeck's
# --dataset-name random, prompt for prompt the same from the same seed (a test checks it against
# vLLM 0.32's RandomDataset; 0.26's is the same code); the first step compares them on this host.
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
launch="--enforce-eager --max-model-len 2048 --gpu-memory-utilization 0.85"
write_models 1b $base/models1b bf16
stamp "model written"
python3 - "$base/models1b/bf16" <<'PY'
import sys
from transformers import AutoTokenizer
from vllm.benchmarks.datasets import RandomDataset
from vllm.tokenizers import get_tokenizer
from quantdeck.core.bench.client import random_dataset, tokenizer_vocab
path = sys.argv[1]
theirs = [r.prompt for r in RandomDataset(random_seed=0).sample(
    get_tokenizer(path), 16, input_len=512, output_len=128)]
hf = AutoTokenizer.from_pretrained(path)
class Local:  # the server's /tokenize and /detokenize, as the same tokenizer answers them
    def count(self, text): return len(hf(text)["input_ids"])
    def encode(self, text, special): return hf.encode(text, add_special_tokens=special)
    def decode(self, ids): return hf.decode(ids)
ours = [r.prompt for r in random_dataset(Local(), tokenizer_vocab(path), 512, 128, 16, 16, 0)]
print(f"random prompts: {sum(a == b for a, b in zip(ours, theirs))} of {len(theirs)} the same "
      "as this host's vLLM's")
PY
python3 benchmarks/bench_fidelity.py --serve "$base/models1b/bf16 $launch" --rounds 6 \
  --concurrency 16 --num-prompts 128 --input-len 512 --output-len 128 --keep $results/fid3-c16 \
  2>&1 | tee $results/fidelity3-c16.txt
stamp "fidelity c=16 done"
python3 benchmarks/bench_fidelity.py --serve "$base/models1b/bf16 $launch" --rounds 4 \
  --concurrency 1 --num-prompts 24 --input-len 512 --output-len 64 --keep $results/fid3-c1 \
  2>&1 | tee $results/fidelity3-c1.txt
stamp "fidelity c=1 done"
