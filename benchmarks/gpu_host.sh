#!/bin/bash
# Steps of a GPU session on the lent H200 (see docs/gpu-validation.md). Each step is one short
# `device` call; the host keeps its files only while warm, so they run back to back.
#
#   bash benchmarks/gpu_host.sh stash N      # keep .bundle/part.0N (carried) in /root/qd/parts
#   bash benchmarks/gpu_host.sh setup PLAN   # assemble vLLM, start benchmarks/gpu_plans/PLAN.sh
#   bash benchmarks/gpu_host.sh next PLAN    # start another plan when the running one is done
#   bash benchmarks/gpu_host.sh wait SECONDS # wait for the plan, bring results back ($OUT)
#
# A plan is a bash script of Quantdeck's own CLI calls (quantize, plan, serve --record, bench,
# tune) run in its own session so that it outlives one call; it writes into $results and gets
# $base, $repo, $results and the model writers below.
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
base=/root/qd
results=$base/results
export PYTHONPATH=/root/vllm-site:$base/extra:$repo
export QUANTDECK_CACHE_DIR=$base/cache QUANTDECK_DATA_DIR=$base/data QUANTDECK_CONFIG_DIR=$base/config
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
mkdir -p $base/parts $results

# random_llama.py ROOT KINDS writes random Llama-3-8B-shaped checkpoints; a smaller shape is the
# same script with its one shape line changed (1b: Llama-3.2-1B's shape, untied head).
write_models() {  # write_models SHAPE ROOT KINDS
  local script=$base/random_llama.py  # kept by setup: later calls do not carry .bundle
  if [ "$1" = 1b ]; then
    sed 's/^H, L, NH, NKV, I, V, HD = .*/H, L, NH, NKV, I, V, HD = 2048, 16, 32, 8, 8192, 128256, 64/' \
      "$script" > $base/random_llama_1b.py
    script=$base/random_llama_1b.py
  fi
  (cd $base && python3 "$script" "$2" "$3" 2>&1 | grep -v Warning | tail -4)
}

case "${1:-}" in
stash)
  cp "$repo/.bundle/part.0$2" $base/parts/ && ls -la $base/parts
  ;;
setup|next)
  # setup: assemble, then start PLAN; next: start PLAN after the one before it finished
  [ -f "$repo/benchmarks/gpu_plans/${2:?plan name}.sh" ] || { echo "no plan $2" >&2; exit 2; }
  t0=$(date +%s)
  if [ "$1" = setup ]; then
    cp "$repo/.bundle/random_llama.py" $base/
    bash "$repo/.bundle/assemble.sh" $base/parts /root/vllm-site || exit 1
    python3 -m pip install -q --no-index --no-deps --no-compile --target $base/extra "$repo"/.whl/*.whl
    # the host sets PYTHONDONTWRITEBYTECODE=1 and ships no .pyc: without this every server
    # start compiles vLLM's and torch's sources again (~45 s of a 1B start instead of ~10)
    python3 -m compileall -q -j 12 /root/vllm-site $base/extra \
      "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" > /dev/null
    python3 -c "import vllm, torch, quantdeck.cli; print('vllm', vllm.__version__, 'torch', torch.__version__)"
    echo "assembled in $(( $(date +%s) - t0 )) s"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  else
    while [ ! -f $results/DONE ]; do sleep 3; done
    rm -f $results/DONE; mv $results/driver.log $results/driver-$(date +%s).log
  fi
  # each device call lays the working tree down afresh, its files briefly missing (a plan's
  # import failed that way): the plan, which outlives its call, runs from a copy of its own
  rm -rf $base/repo && cp -r "$repo" $base/repo && repo=$base/repo
  export PYTHONPATH=/root/vllm-site:$base/extra:$repo
  plan=$repo/benchmarks/gpu_plans/$2.sh
  export -f write_models
  export repo base results
  cd "$repo"
  setsid nohup bash -c "t0=\$(date +%s); source '$plan'; echo \"plan done in \$(( \$(date +%s) - t0 )) s\"; touch $results/DONE" \
    > $results/driver.log 2>&1 < /dev/null &
  echo "plan $2 started"
  ;;
wait)
  end=$(( $(date +%s) + ${2:-500} ))
  while [ ! -f $results/DONE ] && [ "$(date +%s)" -lt "$end" ]; do sleep 5; done
  cut -c1-400 $results/driver.log | tail -60
  [ -f $results/DONE ] && echo "plan finished"
  tar -C $base -czf "$OUT/results.tgz" results && ls -la "$OUT"
  ;;
*)
  echo "usage: $0 stash N | setup PLAN | next PLAN | wait SECONDS" >&2; exit 2
  ;;
esac
