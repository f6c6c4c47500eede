#!/usr/bin/env bash
# The whole test suite, in two passes (the README's test command runs this):
#
#   1. every test not marked `solo`, on two workers at once (pytest-xdist, a module per worker:
#      its module fixtures start once). Most of the suite's time is vLLM starting, and a start
#      is one interpreter importing vLLM on one core: two tests at a time use both.
#   2. the `solo` tests, one at a time with nothing beside them: they judge speed, latency or a
#      time bound against real servers (live trials, A/B, tune, the fleet's failover), which a
#      neighbour taking a core would make a coin toss.
#
#   bash packaging/test.sh                 # the whole suite
#   bash packaging/test.sh tests/cli -x    # arguments go to both passes
#   QUANTDECK_TEST_WORKERS=1 bash packaging/test.sh   # the first pass on one worker
#
# Both passes keep the engine probes (what each vLLM accepts: a probe imports vLLM, ~10 s of a
# core) in one temporary folder of this run, removed at the end: every test's own cache folder
# would otherwise probe the same engine again on its first server start.
#
# Exit status: the first pass's failure, else the second's; "no tests ran" (5) only when
# neither pass ran a test.
set -uo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-.venv/bin/python}
workers=${QUANTDECK_TEST_WORKERS:-2}
if [ -z "${QUANTDECK_PROBE_DIR:-}" ]; then
  probes=$(mktemp -d "${TMPDIR:-/tmp}/quantdeck-probes.XXXXXX") || exit 1
  trap 'rm -rf "$probes"' EXIT
  export QUANTDECK_PROBE_DIR=$probes
fi

"$py" -m pytest -n "$workers" --dist loadfile -m "not solo" "$@"
first=$?
"$py" -m pytest -m solo "$@"
second=$?

for rc in "$first" "$second"; do
  case "$rc" in
    0 | 5) ;;
    *) exit "$rc" ;;
  esac
done
[ "$first" -eq 5 ] && [ "$second" -eq 5 ] && exit 5
exit 0
