#!/usr/bin/env bash
# The prepared GPU check (bench/tools/gpu_check.py): the device copy's rate, every algorithm on
# every transport checked bit for bit, one small case under compute-sanitizer (racecheck and
# synccheck), every algorithm's busbw on one GPU beside the bound its memory allows, and NCCL at
# one rank per GPU or why not. Each part runs under its share of TIME_LIMIT and sizes its work
# from it; its results are written as it goes, so a part cut off keeps what it measured. Writes
# OUTPUT.json and OUTPUT.md (default results/gpu-<gpu name>); exits 1 if a part failed, an element
# was wrong or the sanitizer found errors, 2 if there is no GPU (or no mpiexec).
#
# Runs on a machine with no MPI library and no network: without an mpiexec it installs the mpich
# and mpi4py wheels of WHEELS (bench/gpu_wheels.sh fetches them where there is a network) into a
# folder of its own, offline.
#
# Usage: bench/gpu_check.sh [OUTPUT]
# Environment: PYTHON (python3), MPIEXEC (the one beside PYTHON, else on PATH, else from WHEELS),
#   WHEELS (.whl), RANKS ("2 4"), TIME_LIMIT (seconds for the whole check, 270), MIN_BYTES (1M),
#   MAX_BYTES (1G: the most a sweep reaches while time is left), LARGEST_COUNT (1000003),
#   DEVICE (gpu; cpu runs the same check on NumPy buffers).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
python=${PYTHON:-python3}
device=${DEVICE:-gpu}
limit=${TIME_LIMIT:-270}
read -r -a ranks_list <<< "${RANKS:-2 4}"
started=$(date +%s)
parts=$(mktemp -d)
trap 'rm -rf "$parts"' EXIT
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export MPIR_CVAR_CH4_NETMOD=${MPIR_CVAR_CH4_NETMOD:-ofi}  # one machine: shared memory whichever netmod

mpiexec=${MPIEXEC:-$(dirname "$(command -v "$python")")/mpiexec}
[ -x "$mpiexec" ] || mpiexec=$(command -v mpiexec || true)
if [ -z "$mpiexec" ]; then
    wheels=${WHEELS:-.whl}
    prefix="$parts/mpi"
    echo "== no mpiexec: installing mpich and mpi4py from $wheels into $prefix (offline)"
    "$python" -m pip install -q --no-index --no-deps --ignore-installed --find-links "$wheels" --prefix "$prefix" mpich mpi4py ||
        { echo "gpu_check.sh: no mpiexec, and no mpich and mpi4py wheels in $wheels (bench/gpu_wheels.sh)" >&2; exit 2; }
    site=$("$python" -c 'import sys, sysconfig; print(sysconfig.get_path("platlib", vars={"base": sys.argv[1], "platbase": sys.argv[1]}))' "$prefix")
    export PATH="$prefix/bin:$PATH" PYTHONPATH="$site:$PYTHONPATH"
    export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$prefix/lib"  # appended: the driver's libraries may be found through it
    mpiexec="$prefix/bin/mpiexec"
fi

if [ "$device" = gpu ]; then
    name=$("$python" -c "import cupy; print(cupy.cuda.runtime.getDeviceProperties(0)['name'].decode())") ||
        { echo "gpu_check.sh: no CUDA GPU visible to CuPy" >&2; exit 2; }
    gpus=$("$python" -c "import cupy; print(cupy.cuda.runtime.getDeviceCount())")
else
    name=host gpus=0
fi
output=${1:-results/gpu-$(printf '%s' "$name" | tr -cs 'A-Za-z0-9.' '-')}
sizes=(--min-bytes "${MIN_BYTES:-1M}" --max-bytes "${MAX_BYTES:-1G}" --largest-count "${LARGEST_COUNT:-1000003}")
failed=()

part() {  # part KIND RANKS SHARE_PERCENT [launcher prefix...]: one part, done within its share of the limit
    local kind=$1 ranks=$2 share=$(( limit * $3 / 100 )) file="$parts/$1-$2.json"
    shift 3
    echo "== $kind, $ranks ranks, ${share} s"
    timeout --kill-after=5 $(( share + 15 )) "$mpiexec" -n "$ranks" "$@" "$python" -m bench.gpu_check --part "$kind" \
        --output "$file" --until $(( $(date +%s) + share )) --device "$device" "${sizes[@]}" ||
        failed+=("$kind at $ranks ranks (exit $?)")
}

part copy 1 4
for ranks in "${ranks_list[@]}"; do part check "$ranks" $(( 22 / ${#ranks_list[@]} )); done
sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
if [ "$device" = gpu ] && [ -n "$sanitizer" ]; then
    for tool in racecheck synccheck; do
        part sanitize 2 13 "$sanitizer" --tool "$tool" --log-file "$parts/sanitize-$tool-%p.log"
        mv "$parts/sanitize-2.json" "$parts/sanitize-$tool.json" 2>/dev/null || true
    done
else
    reason=$([ "$device" = gpu ] && echo "compute-sanitizer not found" || echo "not checked: no GPU")
    printf '{"part": "sanitize", "ranks": 2, "complete": true, "cut": null, "note": "%s"}\n' "$reason" \
        > "$parts/sanitize-skipped.json"
fi
for ranks in "${ranks_list[@]}"; do part busbw "$ranks" $(( 28 / ${#ranks_list[@]} )); done
part nccl $(( gpus > 1 ? gpus : 2 )) 6

status=0
"$python" -m bench.gpu_check --merge "$parts" -o "$output" || status=1
echo "== done in $(( $(date +%s) - started )) s of $limit"
if [ ${#failed[@]} -gt 0 ]; then
    echo "gpu_check.sh: failed: ${failed[*]}" >&2
    status=1
fi
exit $status
