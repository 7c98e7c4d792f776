#!/usr/bin/env bash
# Workstation launcher: the all-reduce sweep of every algorithm with the venv's mpiexec.
#   RANKS  rank count (default: the number of cores)
#   VENV   the virtual environment (default: .venv beside this repository)
# Extra arguments go to `python -m bench` (default: -b 8 -e 64M -f 4).
# The output is kept in results/<timestamp>/sweep.txt; the exit status is the benchmark's.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
venv=${VENV:-$repo/.venv}
ranks=${RANKS:-$(nproc)}
[ -x "$venv/bin/mpiexec" ] || { echo "no $venv/bin/mpiexec: install first (see README.md)" >&2; exit 2; }
out="$repo/results/$(date -u +%Y%m%dT%H%M%SZ)"
mkdir -p "$out"
(( $# )) || set -- -b 8 -e 64M -f 4
cd "$repo"
set +e
"$venv/bin/mpiexec" -n "$ranks" "$venv/bin/python" -m bench "$@" > "$out/sweep.txt.part"
status=$?
set -e
mv "$out/sweep.txt.part" "$out/sweep.txt"   # atomic: a reader never sees half a file
echo "results: $out/sweep.txt (exit $status)"
exit $status
