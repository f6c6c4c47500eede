# Fifth GPU session, second lease: is it the client's work per message? quantdeck bench made to
# do what vllm bench serve does with every streamed message (json.loads, keep the text), against
# vllm bench serve, same prompts (both random, same seed), c=16, as fidelity3.sh.
# (It ran benchmarks/vllm_like_client.py, since folded into quantdeck.core.bench.client's own client and removed.)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
launch="--enforce-eager --max-model-len 2048 --gpu-memory-utilization 0.85"
write_models 1b $base/models1b bf16
stamp "model written"
python3 benchmarks/bench_fidelity.py --quantdeck-entry benchmarks/vllm_like_client.py \
  --serve "$base/models1b/bf16 $launch" --rounds 3 --concurrency 16 --num-prompts 128 \
  --input-len 512 --output-len 128 \
  --keep $results/heavy-c16 2>&1 | tee $results/heavy-c16.txt
stamp "heavy c=16 done"
