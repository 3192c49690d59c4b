#!/bin/bash
# Bring up a throwaway Slurm cluster on this machine, for the tests and for trying the Slurm backend:
# one slurmctld plus NNODES virtual nodes (one `slurmd -N nodeK` each; Debian builds slurmd with
# MULTIPLE_SLURMD), each declaring GPUS_PER_NODE fake GPUs as gres. Needs root (apt, daemons, /etc/hosts).
#
# Idempotent: when the running cluster already has this configuration and every node answers, it only
# prints the node table (well under a second). A different configuration restarts the daemons.
#
# Partitions debug (default) and short (1 minute) are preemptible (PreemptMode=REQUEUE, GraceTime=GRACE_S) by
# jobs of the higher-tier partition urgent: the tests preempt a run for real.
#
#   NNODES=4 GPUS_PER_NODE=8 CPUS_PER_NODE=64 MEM_PER_NODE_MB=512000 GRACE_S=120 slurm/cluster-up.sh
#   SLURM_CI_DIR=/var/spool/slurm-ci   state, logs and pid files (slurm/cluster-down.sh wipes it)
#   ACCOUNTING=1                       adds slurmdbd + MariaDB, so that sacct works
set -euo pipefail
NNODES=${NNODES:-4}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
# Nodes claim more CPUs and memory than the machine has (SlurmdParameters=config_overrides), so that the
# production request (8 CPUs and 64 GB per task) is schedulable here; nothing enforces either (no cgroups).
CPUS_PER_NODE=${CPUS_PER_NODE:-64}
MEM_PER_NODE_MB=${MEM_PER_NODE_MB:-512000}
ACCOUNTING=${ACCOUNTING:-0}
# preempted jobs (debug, short) get this long between SIGTERM and SIGKILL
GRACE_S=${GRACE_S:-120}
S=${SLURM_CI_DIR:-/var/spool/slurm-ci}
LAST=$((NNODES - 1))
HERE=$(cd "$(dirname "$0")" && pwd)

[ "$(id -u)" = 0 ] || { echo "cluster-up.sh: needs root (apt-get, daemons, /etc/hosts)" >&2; exit 1; }

if [ "$ACCOUNTING" = 1 ]; then
  ACCT_LINES="AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost"
else
  ACCT_LINES="AccountingStorageType=accounting_storage/none"
fi

slurm_conf() {
cat <<CONF
# Written by slurm/cluster-up.sh: a throwaway cluster on one machine (state under $S)
ClusterName=ci
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# a requeued job may restart only after cred_expire+1 s (default 120 s)
AuthInfo=cred_expire=10
MailProg=/bin/true
SlurmctldPort=6817
StateSaveLocation=$S/ctld
SlurmdSpoolDir=$S/d-%n
SlurmctldPidFile=$S/slurmctld.pid
SlurmdPidFile=$S/slurmd-%n.pid
SlurmctldLogFile=$S/log/slurmctld.log
SlurmdLogFile=$S/log/slurmd-%n.log
# no systemd and no cgroups here
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
$ACCT_LINES
JobCompType=jobcomp/none
MpiDefault=none
# only the backfill scheduler starts het jobs; bf_interval=1 starts them within a second
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1,bf_hetjob_immediate
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
SlurmdParameters=config_overrides
ReturnToService=2
KillWait=2
# finished jobs stay visible to squeue for a day: the watcher's fallback without accounting
MinJobAge=86400
InactiveLimit=0
NodeName=node[0-$LAST] NodeHostname=localhost NodeAddr=127.0.0.1 Port=17000-$((17000 + LAST)) CPUs=$CPUS_PER_NODE RealMemory=$MEM_PER_NODE_MB Gres=gpu:$GPUS_PER_NODE State=UNKNOWN
# Preemption as production sites do it: a job of a higher PriorityTier partition (urgent) requeues the jobs in
# its way. They get SIGTERM, GraceTime seconds to save their state, then SIGKILL, and are requeued.
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP PriorityTier=1 GraceTime=$GRACE_S
# a 1-minute partition: a longer job is accepted and then pends forever (PartitionTimeLimit); tests use it
PartitionName=short Nodes=ALL MaxTime=1 State=UP PriorityTier=1 GraceTime=$GRACE_S
PartitionName=urgent Nodes=ALL MaxTime=INFINITE State=UP PriorityTier=2 PreemptMode=OFF
CONF
}

# gres/gpu drops GPUs without File= and File= must stat as a device: symlinks to /dev/null do.
gres_conf() {
cat <<CONF
AutoDetect=off
NodeName=node[0-$LAST] Name=gpu File=$S/fakegpu/gpu[0-$((GPUS_PER_NODE - 1))]
CONF
}

# every node answers (sinfo lists a node once per partition)
all_nodes_up() {
  [ "$(timeout 5 sinfo -h -N -o '%N %T' 2>/dev/null | grep -Ev 'down|drain|fail|unknown|not_responding|\*' \
       | cut -d' ' -f1 | sort -u | wc -l)" = "$NNODES" ]
}

# Fast path: the same configuration is running and every node answers.
if command -v scontrol >/dev/null && [ -f /etc/slurm/slurm.conf ] \
   && [ "$(slurm_conf)" = "$(cat /etc/slurm/slurm.conf)" ] && [ "$(gres_conf)" = "$(cat /etc/slurm/gres.conf)" ] \
   && timeout 5 scontrol ping 2>/dev/null | grep -q UP && all_nodes_up; then
  sinfo -N -o "%N %P %T %c %m %G"
  exit 0
fi
# Something else runs (another configuration, or half a cluster): stop it, keep its state.
if [ -f "$S/slurmctld.pid" ] || ls "$S"/slurmd-*.pid >/dev/null 2>&1; then
  SLURM_CI_DIR=$S WIPE=0 "$HERE/cluster-down.sh"
fi

pkgs="slurmctld slurmd slurm-client munge"
[ "$ACCOUNTING" = 1 ] && pkgs="$pkgs slurmdbd mariadb-server"
if ! dpkg -s $pkgs >/dev/null 2>&1; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $pkgs >/dev/null
fi

mkdir -p "$S/ctld" "$S/log" "$S/fakegpu" /etc/slurm
for i in $(seq 0 $((GPUS_PER_NODE - 1))); do ln -sfn /dev/null "$S/fakegpu/gpu$i"; done
# node names must resolve: MASTER_ADDR is the first host of het group 0
for i in $(seq 0 $LAST); do
  grep -Eq "^127\.0\.0\.1\s.*\bnode$i\b" /etc/hosts || echo "127.0.0.1 node$i" >> /etc/hosts
done
slurm_conf > /etc/slurm/slurm.conf
gres_conf > /etc/slurm/gres.conf

# munge: Debian's postinst creates the key; test the daemon by using it (pgrep also matches a zombie)
[ -s /etc/munge/munge.key ] || { mungekey -c -k /etc/munge/munge.key; chown munge:munge /etc/munge/munge.key; }
mkdir -p /run/munge && chown munge:munge /run/munge
munge -n >/dev/null 2>&1 || runuser -u munge -- /usr/sbin/munged

wait_for() {
  local deadline=$((SECONDS + $1)); shift
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || { echo "cluster-up.sh: timed out waiting for: $*; see $S/log" >&2; exit 1; }
    sleep 0.1
  done
}

if [ "$ACCOUNTING" = 1 ]; then
  mkdir -p /run/mysqld && chown mysql:mysql /run/mysqld
  mariadb -e 'select 1' >/dev/null 2>&1 || (setsid /usr/sbin/mariadbd --user=mysql --bind-address=127.0.0.1 \
      --pid-file=/run/mysqld/mysqld.pid > "$S/log/mariadb.log" 2>&1 &)
  wait_for 30 mariadb -e 'select 1'
  # slurmdbd runs as root and reaches MariaDB's root@localhost by unix_socket authentication: no password
  cat > /etc/slurm/slurmdbd.conf <<CONF
AuthType=auth/munge
DbdHost=localhost
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=root
StorageLoc=slurm_acct_db_ci
LogFile=$S/log/slurmdbd.log
PidFile=$S/slurmdbd.pid
CONF
  chmod 600 /etc/slurm/slurmdbd.conf
  slurmdbd
  wait_for 30 sacctmgr -n list cluster
fi

slurmctld -i
for i in $(seq 0 $LAST); do mkdir -p "$S/d-node$i"; slurmd -N "node$i"; done
wait_for 30 all_nodes_up
sinfo -N -o "%N %P %T %c %m %G"
