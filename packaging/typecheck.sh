#!/usr/bin/env bash
# mypy over quantdeck.core. mypy does not follow setuptools' editable-install finder (the
# package-dir mapping core/ -> quantdeck/core), so it reads the tree through a folder of links
# laid out as installed: $tmp/quantdeck/core -> core/.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-$here/.venv/bin/python}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/quantdeck"
ln -s "$here/core" "$tmp/quantdeck/core"
cd "$here"
MYPYPATH="$tmp" "$py" -m mypy --config-file pyproject.toml -p quantdeck.core "$@"
