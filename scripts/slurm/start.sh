#!/usr/bin/env bash
# Bring up a single-node SLURM 22.05 cluster (munge + mariadb + slurmdbd + slurmctld + slurmd) on this
# machine, for `hydra/launcher=slurm` and tests/slow/test_slurm.py; SLURM_NODES=2 makes it two nodes
# (tests/slow/test_slurm_multinode.py: `hydra.launcher.nodes=2`). Debian/Ubuntu without systemd, as
# root: installs slurm-wlm, munge, slurmdbd, mariadb-server with apt-get when missing, writes
# /etc/slurm/slurm.conf (+ slurmdbd.conf) and starts the daemons by hand (no systemd needed).
# Idempotent: re-running starts only what is not running (and restarts the slurm daemons if the
# generated config changed); ~20 s on a fresh machine, ~2 s after install, ~0.2 s when already up.
# Stop with scripts/slurm/stop.sh (PURGE=1 also deletes state, logs and the accounting database).
#   SLURM_LAB_DIR (default $TMPDIR/slurm-local)  where state/spool/logs/pids/db live
#   WITH_DBD=1        run slurmdbd+mariadb so that `sacct` works: without accounting submitit cannot
#                     see a job that died without a result and a Hydra multirun waits forever
#   SLURM_PARTITION=debug
#   SLURM_NODES=1     nodes of the cluster. 2 (or more): nodes lab-n1, lab-n2, ... on this one machine,
#                     one `slurmd -N lab-nI` each on its own port (SLURM's "multiple slurmd" mode, which
#                     Debian's build has), every one with the whole machine's CPUs and memory and
#                     127.0.0.1 as its address (added to /etc/hosts: a job's MASTER_ADDR is its first
#                     node's name). Switching between 1 and 2 restarts the slurm daemons (and ends jobs).
# Choices that matter for preemption tests (see also conf/hydra/launcher/slurm.yaml):
#   AuthInfo=cred_expire=10 + sched_interval=5: a requeued job restarts after ~12 s, not 120 s;
#   MailProg=/bin/true (slurmctld refuses to start without a mailer); proctrack/linuxproc + task/none
#   (no cgroups in containers); the node line is `slurmd -C`'s (CPUs alone => socket/core mismatch).
set -euo pipefail
BASE=${SLURM_LAB_DIR:-${TMPDIR:-/tmp}/slurm-local}
WITH_DBD=${WITH_DBD:-1}
PART=${SLURM_PARTITION:-debug}
NODES=${SLURM_NODES:-1}
T0=$(date +%s.%N)
log() { echo "[slurm/start.sh $(date +%T)] $*"; }
alive() { # alive PIDFILE NAME -> true if the pid in PIDFILE is running and its comm is NAME
  local p; [ -s "$1" ] || return 1; p=$(cat "$1" 2>/dev/null) || return 1
  [ -n "$p" ] && [ "$(cat /proc/"$p"/comm 2>/dev/null)" = "$2" ]
}

case "$NODES" in [1-9]) ;; *) echo "scripts/slurm/start.sh: SLURM_NODES=$NODES, expected 1 to 9" >&2; exit 2 ;; esac
if [ "$(id -u)" != 0 ]; then echo "scripts/slurm/start.sh: must run as root (installs packages, starts daemons)" >&2; exit 3; fi

# ---- 1. packages -----------------------------------------------------------------------------
PKGS="slurm-wlm munge"; [ "$WITH_DBD" = 1 ] && PKGS="$PKGS slurmdbd mariadb-server"
missing=""
for p in $PKGS; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
  command -v apt-get >/dev/null || { echo "scripts/slurm/start.sh: missing$missing and no apt-get" >&2; exit 3; }
  log "installing:$missing"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq $missing >/dev/null   # postinst 'invoke-rc.d ... denied' messages are expected
fi

# ---- 2. dirs, hostname, munge ----------------------------------------------------------------
mkdir -p "$BASE"/{state,spool,log,run} /etc/slurm
chmod 755 "$BASE"
H=$(hostname -s)
if [ "$NODES" = 1 ]; then NAMES=$H; else NAMES=$(seq -f "lab-n%g" "$NODES" | tr '\n' ' '); fi
for n in $H $NAMES; do
  if ! getent hosts "$n" >/dev/null; then echo "127.0.0.1 $n" >> /etc/hosts; log "added $n to /etc/hosts"; fi
done

if [ ! -s /etc/munge/munge.key ]; then mungekey -c -f -k /etc/munge/munge.key; fi
chown munge:munge /etc/munge/munge.key; chmod 400 /etc/munge/munge.key
mkdir -p /run/munge /var/log/munge /var/lib/munge; chown munge:munge /run/munge /var/log/munge /var/lib/munge
if ! alive /run/munge/munged.pid munged; then
  log "starting munged"; rm -f /run/munge/munged.pid
  runuser -u munge -- /usr/sbin/munged --force
  for _ in $(seq 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
fi
munge -n | unmunge >/dev/null || { echo "munge not working" >&2; exit 1; }

# ---- 3. config -------------------------------------------------------------------------------
# node line from the hardware (NodeName=H CPUs= Boards= SocketsPerBoard= CoresPerSocket= ThreadsPerCore= RealMemory=)
NODELINE=$(slurmd -C | head -1)
SLURMD_FILES="SlurmdSpoolDir=$BASE/spool
SlurmdPidFile=$BASE/run/slurmd.pid
SlurmdLogFile=$BASE/log/slurmd.log"
if [ "$NODES" != 1 ]; then   # several slurmd on one host: per-node files (%n = the node's name), ports 6831...
  NODELINE="NodeName=lab-n[1-$NODES] NodeHostname=$H NodeAddr=127.0.0.1 Port=[6831-$((6830 + NODES))] ${NODELINE#NodeName=* }"
  SLURMD_FILES="SlurmdSpoolDir=$BASE/spool/%n
SlurmdPidFile=$BASE/run/slurmd-%n.pid
SlurmdLogFile=$BASE/log/slurmd-%n.log"
  for n in $NAMES; do mkdir -p "$BASE/spool/$n"; done
fi
if [ "$WITH_DBD" = 1 ]; then
  ACCT="AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
JobAcctGatherType=jobacct_gather/linux"
else
  ACCT="AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none"
fi
NEWCONF=$(cat <<EOF
# written by scripts/slurm/start.sh (ablate): tests may restart this cluster as 1 or 2 nodes
ClusterName=lab
SlurmctldHost=$H
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# cred_expire also = how long a requeued job waits before it may start again (default 120 s)
AuthInfo=cred_expire=10
CredType=cred/munge
MpiDefault=none
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=1024
ReturnToService=2
StateSaveLocation=$BASE/state
SlurmctldPidFile=$BASE/run/slurmctld.pid
SlurmctldLogFile=$BASE/log/slurmctld.log
$SLURMD_FILES
SlurmctldDebug=info
SlurmdDebug=info
$ACCT
JobCompType=jobcomp/filetxt
JobCompLoc=$BASE/log/jobcomp.txt
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=5,bf_interval=5
MinJobAge=300
KillWait=10
InactiveLimit=0
$NODELINE State=UNKNOWN
PartitionName=$PART Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
)
CHANGED=0
if [ "$(cat /etc/slurm/slurm.conf 2>/dev/null)" != "$NEWCONF" ]; then
  printf '%s\n' "$NEWCONF" > /etc/slurm/slurm.conf; CHANGED=1; log "wrote /etc/slurm/slurm.conf"
fi

# ---- 4. accounting: private mariadb instance + slurmdbd ---------------------------------------
if [ "$WITH_DBD" = 1 ]; then
  DB=$BASE/mysql; SOCK=/run/mysqld/mysqld.sock
  mkdir -p /run/mysqld; chown mysql:mysql /run/mysqld
  if [ ! -d "$DB/mysql" ]; then
    mkdir -p "$DB"; chown mysql:mysql "$DB"
    log "initialising mariadb datadir $DB"
    mariadb-install-db --user=mysql --datadir="$DB" --skip-test-db \
      --auth-root-authentication-method=socket >"$BASE/log/mariadb-install.log" 2>&1
  fi
  if ! alive /run/mysqld/mariadbd.pid mariadbd; then
    log "starting mariadbd"
    setsid -f mariadbd --no-defaults --user=mysql --datadir="$DB" --socket="$SOCK" \
      --pid-file=/run/mysqld/mariadbd.pid --skip-networking --log-error="$DB/mariadb.err" \
      --innodb-buffer-pool-size=512M --innodb-lock-wait-timeout=900 </dev/null >/dev/null 2>&1
    for _ in $(seq 120); do mariadb -S "$SOCK" -e 'select 1' >/dev/null 2>&1 && break; sleep 0.25; done
  fi
  mariadb -S "$SOCK" -e "CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'slurmpw';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost'; FLUSH PRIVILEGES;"
  DBDCONF="AuthType=auth/munge
DbdHost=localhost
DbdPort=6819
SlurmUser=root
LogFile=$BASE/log/slurmdbd.log
PidFile=$BASE/run/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StoragePass=slurmpw
StorageLoc=slurm_acct_db"
  if [ "$(cat /etc/slurm/slurmdbd.conf 2>/dev/null)" != "$DBDCONF" ]; then
    printf '%s\n' "$DBDCONF" > /etc/slurm/slurmdbd.conf
    alive "$BASE/run/slurmdbd.pid" slurmdbd && kill "$(cat "$BASE/run/slurmdbd.pid")" && sleep 1
  fi
  chmod 600 /etc/slurm/slurmdbd.conf
  if ! alive "$BASE/run/slurmdbd.pid" slurmdbd; then
    log "starting slurmdbd"; slurmdbd
    for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/6819) 2>/dev/null && break; sleep 0.1; done
  fi
fi

# ---- 5. slurmctld + slurmd ---------------------------------------------------------------------
if [ "$CHANGED" = 1 ]; then   # config changed: restart running slurm daemons so they agree
  for f in "$BASE"/run/slurmd.pid "$BASE"/run/slurmd-*.pid "$BASE/run/slurmctld.pid"; do   # every slurmd: also those of the other node count
    d=$(basename "$f" .pid); d=${d%%-*}
    if alive "$f" "$d"; then
      p=$(cat "$f"); log "restarting $(basename "$f" .pid) (config changed)"; kill "$p"
      for _ in $(seq 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    fi
  done
fi
if ! alive "$BASE/run/slurmctld.pid" slurmctld; then log "starting slurmctld"; slurmctld; fi
for _ in $(seq 100); do scontrol ping 2>/dev/null | grep -q 'is UP' && break; sleep 0.1; done
if [ "$NODES" = 1 ]; then
  if ! alive "$BASE/run/slurmd.pid" slurmd; then log "starting slurmd"; slurmd; fi
else
  for n in $NAMES; do
    if ! alive "$BASE/run/slurmd-$n.pid" slurmd; then log "starting slurmd -N $n"; slurmd -N "$n"; fi
  done
fi

# ---- 6. wait for the nodes to be idle ----------------------------------------------------------
for n in $NAMES; do
  st=""
  for i in $(seq 120); do
    st=$(sinfo -h -n "$n" -o %T 2>/dev/null | head -1)
    case "$st" in
      idle|mixed|allocated) break ;;
      down*|drain*|inval*) [ "$i" = 10 ] && scontrol update NodeName="$n" State=RESUME 2>/dev/null || true ;;
    esac
    sleep 0.5
  done
  case "$st" in idle|mixed|allocated) ;; *)
    echo "node $n not ready (state '$st'); see $BASE/log/" >&2; tail -20 "$BASE/log/slurmctld.log" >&2; exit 1 ;;
  esac
done
sinfo
log "cluster up in $(awk "BEGIN{printf \"%.1f\", $(date +%s.%N) - $T0}") s (nodes $(echo $NAMES): $st)"
