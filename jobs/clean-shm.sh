#!/usr/bin/env bash
# clean-shm.sh SINCE [WAIT]: remove MPICH's shared-memory files (/dev/shm/mpich_shm_*) that this
# user created at or after SINCE (seconds since the epoch) and that no live process maps.
# MPICH leaves them (about 1 MiB a rank) whenever a job ends abnormally (an abort, a signal, a
# time limit); the job scripts run this when they exit. Ranks still on their way out may map
# such a file for a moment: it waits up to WAIT seconds (default 10) for them. Prints what it
# removed.
set -uo pipefail
since=${1:?usage: clean-shm.sh SINCE_EPOCH_SECONDS [WAIT_SECONDS]}
wait_s=${2:-10}
shopt -s nullglob

candidates() {  # ours, made since SINCE
  local file
  for file in /dev/shm/mpich_shm_*; do
    [ -O "$file" ] && [ "$(stat -c %Y "$file" 2>/dev/null || echo 0)" -ge "$since" ] && echo "$file"
  done
}

mapped() { grep -qsF -- "$1" /proc/[0-9]*/maps; }

deadline=$((SECONDS + wait_s))
while :; do
  busy=0
  while read -r file; do
    if mapped "$file"; then
      busy=1
    else
      rm -f -- "$file" && echo "clean-shm: removed $file"
    fi
  done < <(candidates)
  if [ "$busy" = 0 ] || [ "$SECONDS" -ge "$deadline" ]; then
    break
  fi
  sleep 0.5
done
exit 0
