# Fourth GPU session (2026-12-01): the load generator on aiohttp, against `vllm bench serve` on
# the same server, ABBA, at 16 concurrent and at batch 1 (issue 6's fidelity goal); then what
# each client costs on this host's CPU against a server that answers at once.
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
launch="--enforce-eager --max-model-len 2048 --gpu-memory-utilization 0.85"
write_models 1b $base/models1b bf16
stamp "model written"
python3 -c "import aiohttp; print('aiohttp', aiohttp.__version__)"
python3 benchmarks/bench_fidelity.py --serve "$base/models1b/bf16 $launch" --rounds 4 \
  --concurrency 16 --num-prompts 128 --input-len 512 --output-len 128 --keep $results/fid-c16 \
  2>&1 | tee $results/fidelity-c16.txt
stamp "fidelity c=16 done"
python3 benchmarks/bench_fidelity.py --serve "$base/models1b/bf16 $launch" --rounds 4 \
  --concurrency 1 --num-prompts 32 --input-len 512 --output-len 64 --keep $results/fid-c1 \
  2>&1 | tee $results/fidelity-c1.txt
stamp "fidelity c=1 done"
python3 benchmarks/client_cost.py --requests 100 --rounds 2 --concurrency 1 16 \
  2>&1 | tee $results/client_cost.txt
stamp "client cost done"
