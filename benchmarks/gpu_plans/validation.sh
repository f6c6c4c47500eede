# The first validation run (2026-11-29): 8B checkpoints, an FP8 conversion by Quantdeck's own job
# beside the first launches, then every launch configuration of gpu_validation.py.
write_models 8b $base/models bf16,gptq,awq
echo "models written"
python3 "$repo/benchmarks/nvml_snapshot.py" | tee $results/nvml_snapshot.txt
python3 "$repo/benchmarks/metrics_parse.py" 2>&1 | tail -5 | tee $results/metrics_parse.txt
python3 -m quantdeck.cli quantize $base/models/bf16 --method fp8 --out $base/models/fp8 --json-events \
  > $results/quantize-fp8.jsonl 2>&1 &
python3 benchmarks/gpu_validation.py --root $base/models --out $results \
  --configs bf16-graphs,bf16-eager,fp8-inflight-graphs,fp8-converted-graphs,gptq-graphs,awq-graphs,bnb4-graphs,bnb4-eager
wait
