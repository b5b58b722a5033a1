#!/usr/bin/env bash
# Stop the SLURM cluster started by scripts/slurm/start.sh (one node, or SLURM_NODES=2): cancel its
# jobs, then stop its daemons by the PIDs in their pid files (the process name is checked first, so a
# stale pid file never kills an unrelated process). Idempotent: what is not running is skipped. Installed packages stay.
#   PURGE=1  also delete state, spool, logs and the accounting database under SLURM_LAB_DIR
set -uo pipefail
BASE=${SLURM_LAB_DIR:-${TMPDIR:-/tmp}/slurm-local}
stop() { # stop PIDFILE NAME
  local f=$1 n=$2 p
  [ -s "$f" ] || { echo "$n: no pid file"; return 0; }
  p=$(cat "$f")
  if [ "$(cat /proc/"$p"/comm 2>/dev/null)" != "$n" ]; then echo "$n: not running (stale pid $p)"; rm -f "$f"; return 0; fi
  kill -TERM "$p"
  for _ in $(seq 150); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$p" 2>/dev/null; then echo "$n: still alive after 15 s, SIGKILL $p"; kill -KILL "$p"; sleep 0.5; fi
  echo "$n: stopped (pid $p)"; rm -f "$f"
}
if command -v scontrol >/dev/null && scontrol ping 2>/dev/null | grep -q 'is UP'; then
  scancel --quiet --user=root 2>/dev/null   # leave no orphaned slurmstepd / job processes behind
  for _ in $(seq 30); do [ -z "$(squeue -h 2>/dev/null)" ] && break; sleep 0.5; done
fi
for f in "$BASE"/run/slurmd.pid "$BASE"/run/slurmd-*.pid; do [ -e "$f" ] && stop "$f" slurmd; done   # slurmd.pid, or slurmd-lab-nI.pid (SLURM_NODES=2)
stop "$BASE/run/slurmctld.pid" slurmctld
stop "$BASE/run/slurmdbd.pid"  slurmdbd
stop /run/mysqld/mariadbd.pid  mariadbd
stop /run/munge/munged.pid     munged
if [ "${PURGE:-0}" = 1 ]; then
  rm -rf "$BASE"/{state,spool,log,run,mysql}; echo "purged $BASE state"
fi
