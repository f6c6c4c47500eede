# Next GPU session: the client's fidelity at 16 concurrent with more rounds, first with both
# clients sending the same prompts (the clients alone), then each its own (the goal as stated).
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
launch="--enforce-eager --max-model-len 2048 --gpu-memory-utilization 0.85"
write_models 1b $base/models1b bf16
load="--concurrency 16 --num-prompts 128 --input-len 512 --output-len 128"
python3 benchmarks/bench_fidelity.py --serve "$base/models1b/bf16 $launch" --rounds 6 $load \
  --same-prompts --keep $results/fid2-same-c16 2>&1 | tee $results/fidelity2-same-c16.txt
stamp "same prompts done"
python3 benchmarks/bench_fidelity.py --serve "$base/models1b/bf16 $launch" --rounds 6 $load \
  --keep $results/fid2-c16 2>&1 | tee $results/fidelity2-c16.txt
stamp "own prompts done"
