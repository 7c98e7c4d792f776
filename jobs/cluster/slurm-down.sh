#!/usr/bin/env bash
# slurm-down.sh - stop a single-node Slurm cluster started by slurm-up.sh.
#
# Usage: jobs/cluster/slurm-down.sh STATE_DIR
#
# Cancels the cluster's jobs (if its controller still answers), then stops only
# the daemons whose pids are recorded in STATE_DIR/slurmd.pid and
# STATE_DIR/slurmctld.pid, and only after checking (via /proc/PID/cmdline) that
# each pid is still a slurmd/slurmctld started with STATE_DIR/slurm.conf:
# SIGTERM, wait up to 15 s, then SIGKILL. Never kills by process name and
# removes nothing but those pid files; logs and state stay in STATE_DIR.
# Idempotent: a missing STATE_DIR, missing pid files or dead pids are fine
# (exit 0).
set -euo pipefail

export PATH="$PATH:/usr/sbin:/sbin"

if [[ $# -ne 1 || -z "$1" ]]; then
    echo "usage: $0 STATE_DIR" >&2
    exit 2
fi
if [[ ! -d "$1" ]]; then
    echo "slurm-down: $1 does not exist, nothing to stop" >&2
    exit 0
fi
state="$(cd "$1" && pwd -P)"
conf="$state/slurm.conf"

# shellcheck source=jobs/cluster/pids.sh
source "$(dirname "${BASH_SOURCE[0]}")/pids.sh"

# Cancel running jobs first so that no slurmstepd / job processes outlive slurmd.
if [[ -f "$conf" ]] && our_pid "$state/slurmctld.pid" slurmctld "$conf" >/dev/null; then
    jobs_left="$(SLURM_CONF="$conf" timeout 10 squeue -h -o %A 2>/dev/null || true)"
    if [[ -n "$jobs_left" ]]; then
        # shellcheck disable=SC2086 # one job id per word
        SLURM_CONF="$conf" timeout 10 scancel $jobs_left 2>/dev/null || true
        for _ in $(seq 1 30); do
            [[ -z "$(SLURM_CONF="$conf" timeout 10 squeue -h -t R,CG -o %A 2>/dev/null || true)" ]] && break
            sleep 0.5
        done
    fi
fi

stop() {
    local name="$1" pidfile="$state/$1.pid" pid i
    if pid="$(our_pid "$pidfile" "$name" "$conf")"; then
        kill -TERM "$pid" 2>/dev/null || true
        for ((i = 0; i < 30; i++)); do
            [[ -d "/proc/$pid" ]] || break
            sleep 0.5
        done
        if our_pid "$pidfile" "$name" "$conf" >/dev/null; then
            echo "slurm-down: $name ($pid) ignored SIGTERM for 15 s, sending SIGKILL" >&2
            kill -KILL "$pid" 2>/dev/null || true
            for ((i = 0; i < 10; i++)); do
                [[ -d "/proc/$pid" ]] || break
                sleep 0.5
            done
        fi
        echo "slurm-down: stopped $name ($pid)" >&2
    elif [[ -s "$pidfile" ]]; then
        echo "slurm-down: $name pid in $pidfile is not running (or not ours), leaving it alone" >&2
    fi
    rm -f "$pidfile"
}

stop slurmd
stop slurmctld
exit 0
