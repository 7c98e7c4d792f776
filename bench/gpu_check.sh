#!/usr/bin/env bash
# The prepared GPU check (bench/gpu_check.py): correctness and busbw of every
# algorithm and transport on CuPy buffers with 2 and 4 ranks (sharing the GPUs there are),
# NCCL where every rank has its own GPU, and the device copy bandwidth as the reference.
# Writes OUTPUT.json and OUTPUT.md (default results/gpu-<gpu name>) from the rank counts
# that finished; exits 1 if one did not finish or any element was wrong. Under 5 minutes
# on one H200 (each rank count is cut off after PART_TIMEOUT).
#
# Usage: bench/gpu_check.sh [OUTPUT]
# Environment: PYTHON (python3), MPIEXEC (the one beside PYTHON, else on PATH), RANKS ("2 4"),
#   MIN_BYTES (1M), MAX_BYTES (1G), LARGEST_COUNT (1000003), PART_TIMEOUT (seconds per rank
#   count, 140), DEVICE (gpu; cpu runs the same check on NumPy buffers).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
python=${PYTHON:-python3}
mpiexec=${MPIEXEC:-$(dirname "$(command -v "$python")")/mpiexec}
if [ ! -x "$mpiexec" ]; then
    mpiexec=$(command -v mpiexec) || { echo "gpu_check.sh: no mpiexec (set MPIEXEC)" >&2; exit 2; }
fi
device=${DEVICE:-gpu}
if [ "$device" = gpu ]; then
    name=$("$python" -c "import cupy; print(cupy.cuda.runtime.getDeviceProperties(0)['name'].decode())") ||
        { echo "gpu_check.sh: no CUDA GPU visible to CuPy" >&2; exit 2; }
else
    name=host
fi
output=${1:-results/gpu-$(printf '%s' "$name" | tr -cs 'A-Za-z0-9.' '-')}
parts=$(mktemp -d)
trap 'rm -rf "$parts"' EXIT
failed=()
for ranks in ${RANKS:-2 4}; do
    echo "== $ranks ranks"
    timeout "${PART_TIMEOUT:-140}" "$mpiexec" -n "$ranks" "$python" -m bench.gpu_check --device "$device" \
        --min-bytes "${MIN_BYTES:-1M}" --max-bytes "${MAX_BYTES:-1G}" \
        --largest-count "${LARGEST_COUNT:-1000003}" --part "$parts/part-$ranks.json" || failed+=("$ranks")
done
shopt -s nullglob
written=("$parts"/part-*.json)
if [ ${#written[@]} -gt 0 ]; then
    "$python" -m bench.gpu_check --merge "${written[@]}" -o "$output" || failed+=(wrong)
fi
if [ ${#failed[@]} -gt 0 ]; then
    echo "gpu_check.sh: failed or wrong: ${failed[*]}" >&2
    exit 1
fi
