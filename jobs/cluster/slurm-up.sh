#!/usr/bin/env bash
# slurm-up.sh - bring up a throw-away single-node Slurm cluster on this machine.
#
# Usage: jobs/cluster/slurm-up.sh STATE_DIR
#
# Everything the cluster needs lives under STATE_DIR (made absolute):
#   slurm.conf               the generated configuration
#   env                      "export SLURM_CONF=STATE_DIR/slurm.conf" (source it)
#   slurmctld.pid slurmd.pid pid files of the two daemons
#   slurmctld.log slurmd.log daemon logs
#   ctld/ spool/             controller state and slurmd spool
#
# The node is this host (NodeName=$(hostname -s), NodeAddr=127.0.0.1) with
# CPUs=$(nproc), in one partition "debug" (default, no time limit). Both daemons
# run as root with auth/none (no munge), no accounting. If another Slurm
# cluster already runs here (ports 6817/6818 busy or a slurmctld/slurmd
# process exists), free ports in 16817-16999 and a unique ClusterName are used;
# nothing else is touched.
#
# Installs slurmctld, slurmd, slurm-client (Debian packages) if missing.
# Exit codes: 0 cluster up and node idle; 2 usage; 3 cannot install or not
# root (callers treat this as "skip"); 1 any other failure (the daemons this
# script started are stopped again and the log tails are printed).
# Stop the cluster with jobs/cluster/slurm-down.sh STATE_DIR.
set -euo pipefail

export PATH="$PATH:/usr/sbin:/sbin"

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)"
wait_s="${SLURM_UP_TIMEOUT:-60}"

die() { echo "slurm-up: $*" >&2; exit 1; }
skip() { echo "slurm-up: SKIP: $*" >&2; exit 3; }

if [[ $# -ne 1 || -z "$1" ]]; then
    echo "usage: $0 STATE_DIR" >&2
    exit 2
fi
case "$1" in
    *[[:space:]]*) die "STATE_DIR must not contain whitespace: '$1'" ;;
esac

# --- packages ----------------------------------------------------------------
have_slurm() {
    command -v slurmctld >/dev/null 2>&1 &&
        command -v slurmd >/dev/null 2>&1 &&
        command -v sbatch >/dev/null 2>&1 &&
        command -v sinfo >/dev/null 2>&1 &&
        command -v srun >/dev/null 2>&1
}

if ! have_slurm; then
    [[ "$(id -u)" -eq 0 ]] || skip "Slurm is not installed and not running as root, cannot apt-get install it"
    command -v apt-get >/dev/null 2>&1 || skip "Slurm is not installed and apt-get is not available"
    pkgs=(slurmctld slurmd slurm-client)
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-get install -y -q --no-install-recommends "${pkgs[@]}" >/dev/null 2>&1; then
        if ! { apt-get update -q >/dev/null 2>&1 &&
            apt-get install -y -q --no-install-recommends "${pkgs[@]}" >/dev/null 2>&1; }; then
            skip "apt-get install ${pkgs[*]} failed"
        fi
    fi
    have_slurm || skip "Slurm commands still missing after apt-get install"
fi
[[ "$(id -u)" -eq 0 ]] || skip "the Slurm daemons must run as root (SlurmUser=root); run as root"
command -v python3 >/dev/null 2>&1 || die "python3 is needed to probe free ports"

# --- state directory ---------------------------------------------------------
mkdir -p "$1"
state="$(cd "$1" && pwd -P)"
[[ "$state" != "/" ]] || die "refusing to use / as STATE_DIR"
conf="$state/slurm.conf"

# shellcheck source=jobs/cluster/pids.sh
source "$here/pids.sh"
ours_alive() { our_pid "$1" "$2" "$conf" >/dev/null; }

node_state() { SLURM_CONF="$conf" timeout 10 sinfo -h -o %T 2>/dev/null | head -n 1 || true; }

if ours_alive "$state/slurmctld.pid" slurmctld || ours_alive "$state/slurmd.pid" slurmd; then
    if ours_alive "$state/slurmctld.pid" slurmctld && ours_alive "$state/slurmd.pid" slurmd &&
        [[ "$(node_state)" == idle ]]; then
        echo "slurm-up: cluster in $state is already up" >&2
        echo "SLURM_CONF=$conf"
        exit 0
    fi
    die "a partial cluster is running from $state; run slurm-down.sh $state first"
fi

# --- ports / cluster name ----------------------------------------------------
port_free() {
    python3 - "$1" <<'EOF'
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
# Like the daemons: TIME_WAIT leftovers are fine, a listener is not.
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
try:
    s.bind(("0.0.0.0", int(sys.argv[1])))
except OSError:
    sys.exit(1)
finally:
    s.close()
EOF
}

other_slurm=0
if pgrep -x slurmctld >/dev/null 2>&1 || pgrep -x slurmd >/dev/null 2>&1; then
    other_slurm=1
fi
if [[ $other_slurm -eq 0 ]] && port_free 6817 && port_free 6818; then
    ctld_port=6817
    slurmd_port=6818
    cluster=bench
else
    ctld_port=""
    slurmd_port=""
    for ((p = 16817; p <= 16999; p++)); do
        port_free "$p" || continue
        if [[ -z "$ctld_port" ]]; then
            ctld_port=$p
        else
            slurmd_port=$p
            break
        fi
    done
    [[ -n "$slurmd_port" ]] || die "no two free TCP ports in 16817-16999"
    cluster="bench${ctld_port}"
fi

# --- configuration -----------------------------------------------------------
node="$(hostname -s)"
[[ -n "$node" ]] || die "hostname -s is empty"
cpus="$(nproc)"
avail_kb="$(awk '/^MemAvailable:/ {print $2}' /proc/meminfo)"
[[ -n "$avail_kb" ]] || avail_kb="$(awk '/^MemFree:/ {print $2}' /proc/meminfo)"
mem_mb=$((avail_kb * 9 / 10240))
((mem_mb >= 1)) || mem_mb=1

# Fresh controller state: a stale clustername file or old jobs would only hurt.
rm -rf "${state:?}/ctld" "${state:?}/spool"
mkdir -p "$state/ctld" "$state/spool" "$state/tmp"
rm -f "$state/slurmctld.pid" "$state/slurmd.pid"

cat >"$conf" <<EOF
# Generated by $here/slurm-up.sh - single-node test cluster, state in $state
ClusterName=$cluster
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/none
CredType=cred/none
MpiDefault=none
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0
StateSaveLocation=$state/ctld
SlurmdSpoolDir=$state/spool
TmpFS=$state/tmp
SlurmctldPidFile=$state/slurmctld.pid
SlurmdPidFile=$state/slurmd.pid
SlurmctldLogFile=$state/slurmctld.log
SlurmdLogFile=$state/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ReturnToService=2
MinJobAge=5
KillWait=5
OverTimeLimit=0
InactiveLimit=0
SlurmctldTimeout=120
SlurmdTimeout=300
NodeName=$node NodeAddr=127.0.0.1 NodeHostname=$node CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN
PartitionName=debug Nodes=$node Default=YES MaxTime=INFINITE State=UP
EOF
echo "export SLURM_CONF=$conf" >"$state/env"

# --- start -------------------------------------------------------------------
fail() {
    echo "slurm-up: $*" >&2
    for f in slurmctld.log slurmd.log; do
        if [[ -f "$state/$f" ]]; then
            echo "----- tail $state/$f -----" >&2
            tail -n 25 "$state/$f" >&2 || true
        fi
    done
    "$here/slurm-down.sh" "$state" >&2 || true
    exit 1
}

export SLURM_CONF="$conf"
# Both daemons fork into the background and write their pid files themselves.
slurmctld -f "$conf" </dev/null >>"$state/slurmctld.log" 2>&1 || fail "slurmctld failed to start"
slurmd -f "$conf" -N "$node" </dev/null >>"$state/slurmd.log" 2>&1 || fail "slurmd failed to start"

started=$SECONDS
deadline=$((started + wait_s))
st=""
while ((SECONDS < deadline)); do
    st="$(node_state)"
    [[ "$st" == idle ]] && break
    if ((SECONDS - started > 5)); then
        ours_alive "$state/slurmctld.pid" slurmctld || fail "slurmctld died"
        ours_alive "$state/slurmd.pid" slurmd || fail "slurmd died"
    fi
    sleep 0.5
done
[[ "$st" == idle ]] || fail "node $node not idle after ${wait_s}s (state: '${st:-none}')"

echo "slurm-up: cluster '$cluster' up (node $node, $cpus CPUs, ports $ctld_port/$slurmd_port); source $state/env" >&2
echo "SLURM_CONF=$conf"
