# Second GPU session, continued on the same host after round2 (its models are in place): the
# converted W8A8 and bnb nf4 checkpoints with CUDA graphs, the mode operators serve in.
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
python3 benchmarks/gpu_validation.py --root $base/models --out $results \
  --configs w8a8-converted-graphs,bnb4-converted-graphs
stamp "graph launches done"
