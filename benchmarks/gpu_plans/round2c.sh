# Second GPU session, last: 2 Hz monitoring vs none again on the 1B (eager), more rounds, the
# sampler's NVML initialised in the warm-up (round2's first monitored round paid for it).
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
python3 benchmarks/monitoring_overhead.py --serve "$base/models1b/bf16 --enforce-eager --max-model-len 2048 --gpu-memory-utilization 0.85" \
  --rounds 8 --concurrency 16 --requests 64 --max-tokens 128 2>&1 | tee $results/monitoring_overhead2.txt
stamp "monitoring overhead done"
