#!/usr/bin/env bash
# Workstation run of the whole suite, with the venv's mpiexec:
#   probe the links -> build the matched trees -> sweep every algorithm and native MPI_Allreduce
#   -> compare -> plot, all under results/<UTC timestamp>/.
# Settings (environment): RANKS (default: cores), VENV, RESULTS (see jobs/lib.sh), and
#   MIN_BYTES (8), MAX_BYTES (64M), FACTOR (4), ITERS (20), WARMUP (5), ALGOS (all),
#   VENDOR_LOG (an nccl-tests log to compare with; default: none).
# Extra arguments go to `python -m bench`.
set -euo pipefail
LAUNCHER=mpiexec
# shellcheck source=jobs/lib.sh
source "$(dirname "$0")/lib.sh"

launch topology probe -o "$out/topology.json" -b 4M --reps 5 --warmup 2
"$python" -m topology tree "$out/topology.json" --method bam > "$out/tree-bam.txt"
"$python" -m topology tree "$out/topology.json" --method km > "$out/tree-km.txt"
status=0
sweep sweep -b "${MIN_BYTES:-8}" -e "${MAX_BYTES:-64M}" -f "${FACTOR:-4}" -n "${ITERS:-20}" \
  -w "${WARMUP:-5}" --algo "${ALGOS:-all}" --topology "$out/topology.json" "$@" || status=$?
"$python" -m bench compare ${VENDOR_LOG:+"$VENDOR_LOG"} "$out/sweep.json" > "$out/compare.txt"
"$python" -m bench model --topology "$out/topology.json" -b "${MIN_BYTES:-8}" -e "${MAX_BYTES:-64M}" \
  -f "${FACTOR:-4}" --results "$out/sweep.json" > "$out/model.txt"
"$python" -m bench plot ${VENDOR_LOG:+"$VENDOR_LOG"} "$out/sweep.json" -o "$out/busbw.png" \
  --title "all-reduce busbw, $ranks ranks on $(hostname -s)"
echo "results: $out (sweep exit $status)"
exit "$status"
