# Seventh GPU session (2026-12-02): batch 1 only (fidelity4.sh's c=1 part did not come back).
# Quantdeck's client as landed: every streamed message read as vllm bench serve does, and no
# timers of its own while it measures (cancel wakes the loop). Same server, ABBA rounds.
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
launch="--enforce-eager --max-model-len 2048 --gpu-memory-utilization 0.85"
write_models 1b $base/models1b bf16
stamp "model written"
python3 benchmarks/bench_fidelity.py --serve "$base/models1b/bf16 $launch" --rounds 8 \
  --concurrency 1 --num-prompts 32 --input-len 512 --output-len 64 --keep $results/fid5-c1 \
  2>&1 | tee $results/fidelity5-c1.txt
stamp "fidelity c=1 done"
