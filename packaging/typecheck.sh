#!/usr/bin/env bash
# mypy over quantdeck.core, quantdeck.cli and quantdeck.gui. mypy does not follow setuptools' editable-install
# finder (the package-dir mapping core/ -> quantdeck/core), so it reads the tree through a
# folder of links laid out as installed: $tmp/quantdeck/core -> core/, and cli/ and gui/ the
# same.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-$here/.venv/bin/python}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/quantdeck"
for pkg in core cli gui; do
    ln -s "$here/$pkg" "$tmp/quantdeck/$pkg"
done
cd "$here"
MYPYPATH="$tmp" "$py" -m mypy --config-file pyproject.toml -p quantdeck.core -p quantdeck.cli -p quantdeck.gui "$@"
