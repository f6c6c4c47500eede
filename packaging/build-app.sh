#!/usr/bin/env bash
# The standalone bundle: the light app (no torch, no vLLM) frozen with PyInstaller (onedir).
#
#   bash packaging/build-app.sh OUTDIR
#
# makes OUTDIR/quantdeck/ (the `quantdeck` executable and its _internal/ folder) and, beside
# it, OUTDIR/quantdeck-VERSION-linux-ARCH.tar.gz holding that folder and install.sh (a link in
# ~/.local/bin, the desktop entry and icons). The bundle serves through an engine, a Python
# with vLLM (`quantdeck engines add PATH`). The build venv and PyInstaller's work folder live in
# OUTDIR/.build (kept: the next build reuses them). A folder or tarball of that name that this
# script did not make is refused, never overwritten; a new build replaces one it made only
# once the new one is complete (built beside it, renamed into place).
set -euo pipefail
out=${1:?usage: bash packaging/build-app.sh OUTDIR}
here=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-python3}
mkdir -p "$out"
out=$(cd "$out" && pwd)
marker=.quantdeck-bundle
if [ -e "$out/quantdeck" ] && [ ! -f "$out/quantdeck/$marker" ]; then
  echo "build-app: $out/quantdeck exists and was not made by this script; choose another OUTDIR" >&2
  exit 2
fi
# a tarball of the name this build writes (any version) must be one of ours too
for t in "$out"/quantdeck-*-linux-*.tar.gz; do
  [ -e "$t" ] || continue
  if ! tar tzf "$t" 2>/dev/null | grep -x "quantdeck/$marker" >/dev/null; then
    echo "build-app: $t was not made by this script; choose another OUTDIR" >&2
    exit 2
  fi
done
work="$out/.build"
venv="$work/venv"
mkdir -p "$work"
[ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check)
# the light install from this source tree (a copy: the build never writes into the tree)
src="$work/src"
rm -rf "$src"
mkdir -p "$src"
(cd "$here" && tar cf - --exclude=__pycache__ pyproject.toml README.md core gui cli assets) | tar xf - -C "$src"
"${pip[@]}" --upgrade pip >/dev/null
"${pip[@]}" --force-reinstall --no-deps "$src"
"${pip[@]}" "$src" "pyinstaller>=6.10"
if "$venv/bin/python" -c "import importlib.util as u, sys; sys.exit(not any(u.find_spec(m) for m in ('torch', 'vllm')))"; then
  echo "build-app: the build venv $venv holds torch or vLLM; remove it and build again" >&2
  exit 1
fi
version=$("$venv/bin/python" -c "import importlib.metadata as md; print(md.version('quantdeck'))")
"$venv/bin/pyinstaller" --noconfirm --log-level WARN --distpath "$work/dist" \
  --workpath "$work/pyinstaller" "$here/packaging/quantdeck.spec"
bundle="$work/dist/quantdeck"
echo "$version" > "$bundle/$marker"
cp "$here/packaging/install.sh" "$bundle/install.sh"
"$bundle/quantdeck" --version >/dev/null  # it starts, or the build fails here
# into place: the old bundle (ours, by the marker) goes only once the new one is whole
if [ -e "$out/quantdeck" ]; then
  mv "$out/quantdeck" "$work/old.$$"
fi
mv "$bundle" "$out/quantdeck"
rm -rf "$work/old.$$"
tarball="quantdeck-$version-linux-$(uname -m).tar.gz"
tar czf "$work/$tarball.part" -C "$out" quantdeck
mv "$work/$tarball.part" "$out/$tarball"
echo "build-app: $out/quantdeck ($(du -sh "$out/quantdeck" | cut -f1)), $out/$tarball ($(du -sh "$out/$tarball" | cut -f1))"
