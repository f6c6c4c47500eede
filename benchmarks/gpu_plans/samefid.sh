# Fourth GPU session, second plan: batch 1 again, both clients sending the same prompts
# (Quantdeck's, as a JSONL file), to tell the client apart from the prompts' content.
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
launch="--enforce-eager --max-model-len 2048 --gpu-memory-utilization 0.85"
write_models 1b $base/models1b bf16
python3 benchmarks/bench_fidelity.py --serve "$base/models1b/bf16 $launch" --rounds 2 \
  --concurrency 1 --num-prompts 12 --input-len 512 --output-len 64 --same-prompts \
  --keep $results/fid-same-c1 2>&1 | tee $results/fidelity-same-c1.txt
stamp "same-prompt fidelity c=1 done"
