#!/usr/bin/env bash
# clean-shm.sh SINCE [WAIT]: remove MPICH's shared-memory files (/dev/shm/mpich_shm_*) that this
# user created at or after SINCE (seconds since the epoch) and that no live process maps.
# MPICH leaves them (about 1 MiB a rank) whenever a job ends abnormally (an abort, a signal, a
# time limit); the job scripts run this when they exit. Ranks still on their way out may map
# such a file for a moment: when every process that maps it carries this job's tag
# (CLEAN_SHM_TAG=T in its environment, as jobs/lib.sh exports for the ranks it starts), the
# file is removed at once, since unlinking does not disturb a process that maps it; a file
# mapped by any other process is waited for, up to WAIT seconds (default 10). Prints what it
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

tag=${CLEAN_SHM_TAG:-}

# busy FILE: true when a process outside this job (one without our tag) maps FILE.
busy() {
  local maps environ
  while read -r maps; do
    environ=${maps%/maps}/environ
    if [ -z "$tag" ] || ! tr '\0' '\n' <"$environ" 2>/dev/null | grep -qxF -- "CLEAN_SHM_TAG=$tag"; then
      return 0
    fi
  done < <(grep -lsF -- "$1" /proc/[0-9]*/maps)
  return 1
}

deadline=$((SECONDS + wait_s))
while :; do
  waiting=0
  while read -r file; do
    if busy "$file"; then
      waiting=1
    else
      rm -f -- "$file" && echo "clean-shm: removed $file"
    fi
  done < <(candidates)
  if [ "$waiting" = 0 ] || [ "$SECONDS" -ge "$deadline" ]; then
    break
  fi
  sleep 0.5
done
exit 0
