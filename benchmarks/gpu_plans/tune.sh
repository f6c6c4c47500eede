# The tuner against the exhaustive grid (issue 6's goal: >= 95 % of the grid's best goodput in
# <= 1/3 of its time), alone in a lease: about 1,100 s (measured 2026-12-01: 20 grid points at
# ~43 s once the host has bytecode, 5 search points). A Llama-3.2-1B-shaped random model in
# eager mode restarts in well under a minute, which is what makes a 20-point grid affordable;
# 64 concurrent, 512 in / 128 out, targets p99 TTFT 1 s and p99 TPOT 50 ms.
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
write_models 1b $base/models1b bf16
stamp "model written"
python3 benchmarks/tune_goal.py $base/models1b/bf16 \
  --extra "--enforce-eager --max-model-len 2048 --gpu-memory-utilization 0.85" \
  --ttft-ms 1000 --tpot-ms 50 \
  --space max_num_seqs=16,32,64,128,256 max_num_batched_tokens=2048,8192 \
          enable_chunked_prefill=true,false \
  --concurrency 64 --num-prompts 128 --input-len 512 --output-len 128 --out $results/tune \
  2>&1 | tee $results/tune_goal.txt
stamp "tune done"
