# Sixth GPU session (2026-12-02): Quantdeck's client now reads every streamed message as
# vllm bench serve does (JSON, text kept); both clients send identical random prompts (same
# seed), same server, ABBA rounds. c=16 as fidelity3.sh, then batch 1.
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
launch="--enforce-eager --max-model-len 2048 --gpu-memory-utilization 0.85"
lscpu | grep -E "^CPU\(s\)|Thread|Core|Socket|Model name" ; nproc
write_models 1b $base/models1b bf16
stamp "model written"
python3 benchmarks/bench_fidelity.py --serve "$base/models1b/bf16 $launch" --rounds 8 \
  --concurrency 16 --num-prompts 128 --input-len 512 --output-len 128 --keep $results/fid4-c16 \
  2>&1 | tee $results/fidelity4-c16.txt
stamp "fidelity c=16 done"
python3 benchmarks/bench_fidelity.py --serve "$base/models1b/bf16 $launch" --rounds 5 \
  --concurrency 1 --num-prompts 24 --input-len 512 --output-len 64 --keep $results/fid4-c1 \
  2>&1 | tee $results/fidelity4-c1.txt
stamp "fidelity c=1 done"
