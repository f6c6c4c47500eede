# Second GPU session (2026-12-01):
# - INT8 W8A8 and bitsandbytes nf4 checkpoints of the 8B made by Quantdeck's own conversion jobs
#   on the host, then launched and measured (issue 7);
# - `quantdeck bench` against `vllm bench serve` on the same GPU server, ABBA (issue 6);
# - the tuner against the exhaustive grid on a Llama-3.2-1B-shaped model (issue 6's goal):
#   a 1B in eager mode restarts in seconds, which is what makes a 20-point grid affordable.
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
launch="--enforce-eager --max-model-len 2048 --gpu-memory-utilization 0.85"
stamp "writing models"
write_models 8b $base/models bf16
write_models 1b $base/models1b bf16
stamp "models written"
python3 "$repo/benchmarks/metrics_parse.py" 2>&1 | tail -3 | tee $results/metrics_parse.txt
for m in w8a8 bnb-nf4; do
  OMP_NUM_THREADS=6 python3 -m quantdeck.cli quantize $base/models/bf16 --method $m \
    --out $base/models/$m --json-events > $results/quantize-$m.jsonl 2>&1 &
done
python3 benchmarks/bench_fidelity.py --serve "$base/models1b/bf16 $launch" --rounds 2 \
  --concurrency 16 --num-prompts 128 --input-len 512 --output-len 128 2>&1 | tee $results/fidelity.txt
stamp "fidelity done"
wait
stamp "conversions done"
for m in w8a8 bnb-nf4; do tail -n1 $results/quantize-$m.jsonl | cut -c1-400; done
python3 benchmarks/gpu_validation.py --root $base/models --out $results --b1-prompts 4 \
  --configs w8a8-converted-eager,bnb4-converted-eager
stamp "launches done"
python3 benchmarks/tune_goal.py $base/models1b/bf16 --extra "$launch" --ttft-ms 1000 --tpot-ms 50 \
  --space max_num_seqs=16,32,64,128,256 max_num_batched_tokens=2048,8192 \
          enable_chunked_prefill=true,false \
  --concurrency 64 --num-prompts 128 --input-len 512 --output-len 128 --out $results/tune \
  2>&1 | tee $results/tune_goal.txt
stamp "tune done"
python3 benchmarks/monitoring_overhead.py --serve "$base/models1b/bf16 $launch" --rounds 4 \
  --concurrency 16 --requests 64 --max-tokens 128 2>&1 | tee $results/monitoring_overhead.txt
stamp "monitoring overhead done"
