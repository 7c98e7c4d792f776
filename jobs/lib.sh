# shellcheck shell=bash
# Shared by the job scripts (sourced, not run): where the repository, venv and results are,
# and how ranks are launched. Settings, all optional, from the environment:
#   REPO      the repository (default: the sbatch submit directory, else this file's parent)
#   VENV      the virtual environment with the package installed (default: $REPO/.venv)
#   LAUNCHER  mpiexec (default: the venv's Hydra mpiexec; inside an allocation it starts its
#             proxies on the allocated nodes through Slurm) or srun (srun --mpi=pmi2, Slurm's
#             PMI2, which the mpich wheel speaks; with the mpich 5.0.2 wheel and Slurm 22.05
#             3 of 10 two-rank jobs hung in MPI_Init here, so it is not the default). srun runs
#             with --kill-on-bad-exit: a rank that ends the job by exiting alone (plumbing/ending.py)
#             gets the others killed, where srun's default leaves them waiting for it
#   RANKS     rank count for mpiexec outside Slurm (default: the number of cores)
#   BIND      what mpiexec binds each rank to: core (default: a core of its own), hwthread,
#             numa, none (Hydra's -bind-to); srun binds as the site configured it
#   RESULTS   the output folder (default: $REPO/results/<job id or UTC timestamp>)

repo=${REPO:-${SLURM_SUBMIT_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}}
venv=${VENV:-$repo/.venv}
python=$venv/bin/python
launcher=${LAUNCHER:-mpiexec}
if [ -n "${SLURM_JOB_ID:-}" ]; then
  ranks=${RANKS:-${SLURM_NTASKS:-1}}
else
  ranks=${RANKS:-$(nproc)}
fi
out=${RESULTS:-$repo/results/${SLURM_JOB_ID:-$(date -u +%Y%m%dT%H%M%SZ)}}

[ -x "$python" ] || { echo "no $python: install first (see README.md), or set VENV" >&2; exit 2; }
mkdir -p "$out"
cd "$repo" || exit 2

# When the script exits, however it ends (a failed step, Ctrl-C, scancel, a time limit), remove
# the /dev/shm/mpich_shm_* files MPICH left behind since it started and no live process maps,
# on every node of the allocation (jobs/clean-shm.sh). The ranks carry this job's tag, so files
# that only our own ranks, still on their way out, map go too: a time limit's SIGKILL follows
# its SIGTERM within seconds (Slurm's KillWait), too soon to wait for them.
job_started=$(date +%s)
CLEAN_SHM_TAG="$(hostname)-$$-$job_started"
export CLEAN_SHM_TAG
clean_shm() {
  "$repo/jobs/clean-shm.sh" "$job_started" >&2
  if [ "${SLURM_JOB_NUM_NODES:-1}" -gt 1 ]; then
    timeout 30 srun --nodes="$SLURM_JOB_NUM_NODES" --ntasks-per-node=1 --kill-on-bad-exit=0 \
      "$repo/jobs/clean-shm.sh" "$job_started" >&2 || true
  fi
}
trap clean_shm EXIT
# Ctrl-C, scancel and a time limit signal every process of the job at once: the ranks end
# together and print why, but the launcher, signalled too, may be gone before a loaded rank's
# line passes through it. The script's own line comes after the launcher has returned (bash
# runs a trap once its foreground command ends), so the log always says why the job ended.
job_name=${SLURM_JOB_NAME:-$(basename "$0")}
interrupted() {
  echo "$job_name: interrupted by $1; the finished sizes are in $out" >&2
  exit "$2"
}
trap 'interrupted SIGINT 130' INT
trap 'interrupted SIGTERM 143' TERM

# launch MODULE ARGS...: run `python -m MODULE ARGS` on every rank.
launch() {
  if [ "$launcher" = srun ]; then
    srun --mpi=pmi2 --kill-on-bad-exit=1 "$python" -m "$@"
  else
    "$venv/bin/mpiexec" -bind-to "${BIND:-core}" -n "$ranks" "$python" -m "$@"
  fi
}

# sweep NAME ARGS...: the benchmark, its table in NAME.txt, nccl-tests JSON in NAME.json and
# every finished row in NAME.jsonl at once (a job killed by its time limit keeps those).
sweep() {
  local name=$1
  shift
  # tee ignores the job's SIGINT and SIGTERM and copies to the end: killed first, it would take
  # the table's last lines with it and break the launcher's output pipe under it
  launch bench --quiet --log "$out/$name.jsonl" -J "$out/$name.json" "$@" | (trap '' INT TERM; tee "$out/$name.txt")
  return "${PIPESTATUS[0]}"
}
