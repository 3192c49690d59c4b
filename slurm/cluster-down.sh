#!/bin/bash
# Stop what slurm/cluster-up.sh started (by its pid files only) and wipe its state (WIPE=0 keeps it).
S=${SLURM_CI_DIR:-/var/spool/slurm-ci}
if command -v scancel >/dev/null; then
  timeout 10 scancel --user=root 2>/dev/null
  # let jobs finish ending: with proctrack/linuxproc a slurmstepd outlives a killed slurmd
  for _ in $(seq 150); do [ -z "$(timeout 5 squeue -h -t R,CG,S 2>/dev/null)" ] && break; sleep 0.1; done
fi
if [ "${WIPE:-1}" = 1 ] && [ -f "$S/slurmdbd.pid" ]; then
  mariadb -e 'drop database if exists slurm_acct_db_ci' 2>/dev/null
fi
pids=$(cat "$S"/slurmd-*.pid "$S/slurmctld.pid" "$S/slurmdbd.pid" 2>/dev/null)
if [ -f "$S/slurmdbd.pid" ]; then pids="$pids $(cat /run/mysqld/mysqld.pid 2>/dev/null)"; fi
# a full teardown also stops munge; a restart (WIPE=0, from cluster-up.sh) keeps it
if [ "${WIPE:-1}" = 1 ]; then pids="$pids $(cat /run/munge/munged.pid 2>/dev/null)"; fi
if [ -n "${pids// /}" ]; then
  kill $pids 2>/dev/null
  for _ in $(seq 50); do
    alive=0; for p in $pids; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ $alive = 0 ] && break; sleep 0.1
  done
  # a slurmd stuck in its first registration ignores SIGTERM
  kill -9 $pids 2>/dev/null
fi
rm -f "$S"/slurmd-*.pid "$S/slurmctld.pid" "$S/slurmdbd.pid"
[ "${WIPE:-1}" = 1 ] && rm -rf "$S"
true
