#!/bin/bash
# Steps of a GPU session on the lent H200 (see docs/gpu-validation.md). `wheel` runs here; the
# others run there, each in one short `device` call that carries .bundle and .whl (the host
# keeps its files only while warm, so the calls run back to back).
#
#   bash benchmarks/gpu_host.sh wheel            # here: Quantdeck's wheel (+ platformdirs') into .whl/
#   bash benchmarks/gpu_host.sh stash N          # keep .bundle/part.0N in /root/qd/parts
#   bash benchmarks/gpu_host.sh rayparts         # here: Ray and its dependencies (cp312 wheels)
#                                                # into .rayparts/part.0N, 50 MB each
#   bash benchmarks/gpu_host.sh stash-ray N      # keep .rayparts/part.0N in /root/qd/rayparts
#   bash benchmarks/gpu_host.sh setup STEP ...   # assemble vLLM, install Quantdeck, start the
#                                                # runner: benchmarks/gpu_plans/run.py STEP ...
#   bash benchmarks/gpu_host.sh next STEP ...    # start the runner again once it is done
#   bash benchmarks/gpu_host.sh wait SECONDS     # wait for it, bring results back ($OUT)
#
# STEP ... is the runner's command line: steps (validation, fidelity, random-check, overhead,
# tune, fleet, ray, metrics-parse, nvml, client-cost) with their options, `+` between steps, e.g.
#   setup fidelity --graphs --rounds 14 --concurrency 1 --num-prompts 32 --output-len 64
# (`python3 benchmarks/gpu_plans/run.py --dry-run STEP ...` prints what it would run.)
#
# The host has no package index. Quantdeck's folders (core/, gui/, cli/, assets/) become the
# `quantdeck` package only when installed (package-dir in pyproject.toml), so the tree on
# PYTHONPATH is not enough: setup installs the wheel built here, with platformdirs (the one
# dependency the host lacks), into /root/qd/extra. The runner runs in its own session so that
# it outlives one call; it writes into /root/qd/results.
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
base=/root/qd
results=$base/results
export PYTHONPATH=/root/vllm-site:$base/extra
export QUANTDECK_CACHE_DIR=$base/cache QUANTDECK_DATA_DIR=$base/data QUANTDECK_CONFIG_DIR=$base/config
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1

# pip --target, or, where pip cannot run, the wheels unzipped into the folder (pure Python: a
# wheel is a zip of the installed files)
install_wheels() {  # install_wheels DIR WHEEL...
  local dir=$1; shift
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$dir" "$@" \
    || python3 - "$dir" "$@" <<'PY'
import sys, zipfile
for wheel in sys.argv[2:]:
    zipfile.ZipFile(wheel).extractall(sys.argv[1])
    print("unzipped", wheel)
PY
}

start_runner() {  # start_runner STEP ...
  # each device call lays the working tree down afresh, its files briefly missing: the runner,
  # which outlives its call, runs from a copy of its own (the benchmark scripts, the fixtures)
  rm -rf $base/repo && cp -r "$repo" $base/repo && cd $base/repo
  setsid nohup bash -c "python3 benchmarks/gpu_plans/run.py --base $base --results $results \
    $(printf '%q ' "$@"); touch $results/DONE" > $results/driver.log 2>&1 < /dev/null &
  echo "runner started: $*"
}

case "${1:-}" in
wheel)
  rm -f "$repo"/.whl/quantdeck-*.whl
  "$repo/.venv/bin/python" -m pip wheel -q --no-deps --no-build-isolation -w "$repo/.whl" "$repo" \
    || exit 1
  ls "$repo"/.whl/platformdirs-*.whl > /dev/null 2>&1 || "$repo/.venv/bin/python" -m pip download \
    -q --no-deps --only-binary=:all: -d "$repo/.whl" platformdirs
  ls -la "$repo/.whl"
  ;;
stash)
  mkdir -p $base/parts && cp "$repo/.bundle/part.0$2" $base/parts/ && ls -la $base/parts
  ;;
rayparts)
  # Ray for the `ray` step (the ray backend); the host's Python is 3.12, with no package index
  rm -rf "$repo/.rayparts" && mkdir -p "$repo/.rayparts/wheels" || exit 1
  "$repo/.venv/bin/python" -m pip download -q --only-binary=:all: --python-version 3.12 \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux_2_28_x86_64 --platform any -d "$repo/.rayparts/wheels" "ray==${2:-2.60.0}" \
    || exit 1
  tar -C "$repo/.rayparts" -cf - wheels | split -b 50M -d - "$repo/.rayparts/part." || exit 1
  rm -rf "$repo/.rayparts/wheels" && ls -la "$repo/.rayparts"
  ;;
stash-ray)
  mkdir -p $base/rayparts && cp "$repo/.rayparts/part.0$2" $base/rayparts/ && ls -la $base/rayparts
  ;;
setup|next)
  [ $# -ge 2 ] || { echo "usage: $0 $1 STEP [OPTIONS] [+ STEP ...]" >&2; exit 2; }
  cmd=$1; shift
  # the runner's arguments checked before anything starts (or, for next, the last run's end)
  python3 "$repo/benchmarks/gpu_plans/run.py" --base $base --dry-run "$@" > /dev/null || exit 2
  mkdir -p $results
  t0=$(date +%s)
  if [ "$cmd" = setup ]; then
    ls "$repo"/.whl/quantdeck-*.whl > /dev/null 2>&1 \
      || { echo "no .whl/quantdeck-*.whl: run 'bash benchmarks/gpu_host.sh wheel' here" >&2; exit 2; }
    cp "$repo/.bundle/random_llama.py" $base/  # kept: later calls need not carry .bundle
    bash "$repo/.bundle/assemble.sh" $base/parts /root/vllm-site || exit 1
    install_wheels $base/extra "$repo"/.whl/*.whl || exit 1
    if ls $base/rayparts/part.0* > /dev/null 2>&1; then  # stash-ray: Ray and what the host lacks
      rm -rf $base/raywheels && cat $base/rayparts/part.0* | tar -C $base -xf - \
        && mv $base/wheels $base/raywheels || exit 1
      # only the distributions this Python has not got (those the host has stay the host's)
      need=$(python3 - $base/raywheels/*.whl <<'PY'
import importlib.metadata as md, os, sys
for w in sys.argv[1:]:
    name = os.path.basename(w).split("-")[0]
    try:
        md.version(name)
    except md.PackageNotFoundError:
        print(w)
PY
      )
      echo "Ray: installing $(echo $need | wc -w) wheels:" $(for w in $need; do basename $w; done)
      [ -n "$need" ] && { install_wheels $base/extra $need || exit 1; }
      # an unzipped wheel loses the executable bits of Ray's gcs_server and raylet
      find $base/extra/ray/core -type f \( -name gcs_server -o -name raylet \) -exec chmod +x {} +
      python3 -c "import ray; print('ray', ray.__version__)" || exit 1
    fi
    # the host sets PYTHONDONTWRITEBYTECODE=1 and ships no .pyc: without this every server
    # start compiles vLLM's and torch's sources again (~45 s of a 1B start instead of ~10)
    python3 -m compileall -q -j 12 /root/vllm-site $base/extra \
      "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" > /dev/null
    (cd / && python3 -c "import vllm, torch, quantdeck.cli, quantdeck.core as c
print('vllm', vllm.__version__, 'torch', torch.__version__, 'quantdeck', c.__path__[0])") \
      || exit 1
    echo "assembled in $(( $(date +%s) - t0 )) s"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  else
    while [ ! -f $results/DONE ]; do sleep 3; done
    rm -f $results/DONE; mv $results/driver.log $results/driver-$(date +%s).log
  fi
  start_runner "$@"
  ;;
wait)
  end=$(( $(date +%s) + ${2:-500} ))
  while [ ! -f $results/DONE ] && [ "$(date +%s)" -lt "$end" ]; do sleep 5; done
  cut -c1-400 $results/driver.log | tail -60
  [ -f $results/DONE ] && echo "runner finished"
  tar -C $base -czf "$OUT/results.tgz" results && ls -la "$OUT"
  ;;
*)
  echo "usage: $0 wheel | stash N | rayparts [VERSION] | stash-ray N | setup STEP ... |" \
    "next STEP ... | wait SECONDS" >&2; exit 2
  ;;
esac
