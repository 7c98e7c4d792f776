#!/usr/bin/env bash
# The heterogeneous network lab: K network namespaces on a bridge, every ordered
# pair shaped with HTB, MPI across them; runs every experiment and writes results/lab/.
# Needs root and iproute2 (ip, tc); exits 3 with the reason when either is missing.
#
# Settings (environment):
#   VENV (.venv)  TAG (arlab: the prefix of every name the lab creates)  OUT (results/lab)
# Extra arguments go to 'python -m bench.lab run' (e.g. --only seed4 --sizes 8M).
#
# Whatever happens (failure, Ctrl-C, kill), the EXIT trap removes this run's namespaces,
# bridge and veths by the names recorded when they were created, and nothing else.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY="${VENV:-.venv}/bin/python"
TAG="${TAG:-arlab}"
ALLREDUCE_LAB_OWNER="run-lab-$$-$(date +%s%N)"
export ALLREDUCE_LAB_OWNER
started=$(date +%s)
# On exit: the lab's namespaces down, and the /dev/shm files of MPI ranks that it ended (jobs/clean-shm.sh).
trap '"$PY" -m bench.lab --tag "$TAG" down >/dev/null || true; jobs/clean-shm.sh "$started" >&2' EXIT
# In the background so that a signal reaches the script at once; the child ends on SIGTERM
# (it takes its own lab down first), then the EXIT trap checks.
"$PY" -m bench.lab --tag "$TAG" run --out "${OUT:-results/lab}" "$@" &
child=$!
trap 'kill -TERM "$child" 2>/dev/null || true; wait "$child" || true; exit 130' INT
trap 'kill -TERM "$child" 2>/dev/null || true; wait "$child" || true; exit 143' TERM
wait "$child"
