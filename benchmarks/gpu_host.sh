#!/bin/bash
# Steps of the GPU validation on the lent H200 (see docs/gpu-validation.md). Each step is one
# short `device` call; the host keeps its files only while warm, so they run back to back.
#
#   bash benchmarks/gpu_host.sh stash N        # keep .bundle/part.0N (carried) in /root/parts
#   bash benchmarks/gpu_host.sh setup CONFIGS  # assemble vLLM, write models, start the driver
#   bash benchmarks/gpu_host.sh wait SECONDS   # wait for the driver, bring results back ($OUT)
#
# The driver is benchmarks/gpu_validation.py: Quantdeck's own `plan`, `serve --record`,
# `bench` per configuration, running in its own session so it outlives one call.
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
base=/root/qd
export PYTHONPATH=/root/vllm-site:$base/extra:$repo
export QUANTDECK_CACHE_DIR=$base/cache QUANTDECK_DATA_DIR=$base/data QUANTDECK_CONFIG_DIR=$base/config
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
mkdir -p $base/parts $base/results

case "${1:-}" in
stash)
  cp "$repo/.bundle/part.0$2" $base/parts/ && ls -la $base/parts
  ;;
setup)
  configs=${2:-bf16-graphs}
  t0=$(date +%s)
  bash "$repo/.bundle/assemble.sh" $base/parts /root/vllm-site || exit 1
  python3 -m pip install -q --no-index --no-deps --no-compile --target $base/extra "$repo"/.whl/*.whl
  python3 -c "import vllm, torch, core.cli; print('vllm', vllm.__version__, 'torch', torch.__version__)"
  echo "assembled in $(( $(date +%s) - t0 )) s"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 "$repo/benchmarks/nvml_snapshot.py" | tee $base/results/nvml_snapshot.txt
  python3 "$repo/benchmarks/metrics_parse.py" 2>&1 | tail -5 | tee $base/results/metrics_parse.txt
  cd $base && python3 "$repo/.bundle/random_llama.py" $base/models bf16,gptq,awq 2>&1 | grep -v Warning | tail -4
  echo "models written at $(( $(date +%s) - t0 )) s"
  cd "$repo"
  setsid nohup bash -c "
    python3 -m core.cli quantize $base/models/bf16 --method fp8 --out $base/models/fp8 --json-events \
      > $base/results/quantize-fp8.jsonl 2>&1 &
    python3 benchmarks/gpu_validation.py --root $base/models --out $base/results --configs $configs
    wait; touch $base/results/DONE" > $base/results/driver.log 2>&1 < /dev/null &
  echo "driver started"
  ;;
wait)
  end=$(( $(date +%s) + ${2:-500} ))
  while [ ! -f $base/results/DONE ] && [ "$(date +%s)" -lt "$end" ]; do sleep 5; done
  cat $base/results/driver.log | cut -c1-600
  tail -2 $base/results/quantize-fp8.jsonl 2>/dev/null | cut -c1-300
  [ -f $base/results/DONE ] && echo "driver finished"
  tar -C $base -czf "$OUT/results.tgz" results && ls -la "$OUT"
  ;;
*)
  echo "usage: $0 stash N | setup CONFIGS | wait SECONDS" >&2; exit 2
  ;;
esac
