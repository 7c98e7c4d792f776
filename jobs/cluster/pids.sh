# shellcheck shell=bash
# Sourced by slurm-up.sh and slurm-down.sh: the one way they recognise their own daemons.

# our_pid PIDFILE NAME CONF: print the pid in PIDFILE if that process is alive and is daemon
# NAME started with configuration file CONF; fail otherwise. Never goes by name alone.
our_pid() {
    local pidfile="$1" name="$2" conf="$3" pid cmd
    [[ -s "$pidfile" ]] || return 1
    pid="$(tr -dc '0-9' <"$pidfile")"
    [[ -n "$pid" && -r "/proc/$pid/cmdline" ]] || return 1
    cmd="$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null)" || return 1
    [[ "$(basename "${cmd%% *}")" == "$name" && "$cmd" == *"$conf"* ]] || return 1
    echo "$pid"
}
