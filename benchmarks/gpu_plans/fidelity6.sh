# Eighth GPU session (2026-12-03): batch 1 with CUDA graphs. The seventh run's eager batch-1
# server moved its median ITL 8.8-16.5 ms from one 32-request run to the next (bound by its own
# Python on the host's CPU), more than the 5 % asked of the clients; with graphs a step costs
# less host CPU and a run takes ~10 s instead of ~25, so more ABBA rounds fit in a lease.
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
launch="--max-model-len 2048 --gpu-memory-utilization 0.85"
write_models 1b $base/models1b bf16
stamp "model written"
python3 benchmarks/bench_fidelity.py --serve "$base/models1b/bf16 $launch" --rounds 14 \
  --concurrency 1 --num-prompts 32 --input-len 512 --output-len 64 --keep $results/fid6-c1 \
  2>&1 | tee $results/fidelity6-c1-graphs.txt
stamp "fidelity c=1 (CUDA graphs) done"
