#!/usr/bin/env bash
# A real Slurm on the emulated cluster of scripts/cluster.sh: Debian's
# slurm-wlm and munge, slurmctld on the first host, one slurmd per host,
# each in the host's network namespace with its own hostname. See
# docs/cluster.md, "Slurm".
#
#   slurm.sh up [--prefix NAME] [--cpus N]   (after cluster.sh up; N: CPUs per node, default nproc)
#   slurm.sh down [--prefix NAME]            (every daemon and job step gone; cluster.sh down calls it)
#   slurm.sh run [--prefix NAME] command...  (on the first host, the batch host: sbatch, srun, squeue, ...)
#   slurm.sh conf [--prefix NAME]            (prints the slurm.conf path: export SLURM_CONF=...)
#   slurm.sh kill-node HOST                  (kill -9 the host's slurmd and everything of its jobs: node loss)
#
# Nothing is written outside /run/tessera-cluster/NAME/slurm: the daemons
# and the clients read SLURM_CONF, munged has its own key and socket there.
# The hosts share one file system, so the two paths a node must own are
# made per host: the spool folder (%n in slurm.conf) and PMIx's client
# folder (a bind mount in the slurmd's own mount namespace).
# Errors: one line on stderr, exit 1.
set -euo pipefail

readonly kStateRoot=/run/tessera-cluster
readonly kSubnet=10.99.0
here=$(cd "$(dirname "${BASH_SOURCE[0]:-$0}")" && pwd)

die() { echo "slurm.sh: error: $*" >&2; exit 1; }
need_root() { [ "$(id -u)" -eq 0 ] || die "must run as root (the daemons run in the cluster's namespaces)"; }
need_slurm() {
  local b
  for b in slurmctld slurmd munged srun sbatch sinfo scontrol unshare; do
    command -v "$b" >/dev/null 2>&1 || die "'$b' is not installed (bash scripts/setup.sh installs slurm-wlm and munge)"
  done
}

parse_prefix() {  # sets prefix, rest=("remaining args")
  prefix=tess; rest=()
  while [ $# -gt 0 ]; do
    case $1 in
      --prefix) prefix=${2:?--prefix needs a value}; shift 2 ;;
      *) rest+=("$1"); shift ;;
    esac
  done
  state=$kStateRoot/$prefix
  S=$state/slurm
}

hosts() { awk '{print $1}' "$state/hosts"; }
first_host() { head -n1 "$state/hosts" | awk '{print $1}'; }

# pids_of_cluster: every process this Slurm started inside the cluster's
# hosts (the daemons, the step daemons, the jobs' tasks, clients started by
# `slurm.sh run`): they carry SLURM_CONF=$S/slurm.conf. Processes in the
# root namespace (a test that exported SLURM_CONF) are never matched.
pids_of_cluster() {
  local want="SLURM_CONF=$S/slurm.conf" h p
  for h in $(hosts); do
    for p in $(ip netns pids "$h" 2>/dev/null || true); do
      tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qxF "$want" && echo "$p"
    done
  done
  return 0
}

write_conf() {
  local cpus=$1 n; n=$(wc -l <"$state/hosts")
  local h1; h1=$(first_host)
  cat >"$S/slurm.conf" <<EOF
# Written by scripts/slurm.sh for the emulated cluster '$prefix'.
ClusterName=$prefix
SlurmctldHost=$h1($kSubnet.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$S/munge/munge.socket
# Debian's OpenMPI talks PMIx (its pmix ext3x component) and has no PMI2
# client, so srun starts ranks through Slurm's mpi/pmix plugin.
MpiDefault=pmix
# No cgroups: the hosts share one kernel and the container's cgroup tree.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$S/jobcomp.log
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
StateSaveLocation=$S/ctld
SlurmdSpoolDir=$S/spool/%n
SlurmctldPidFile=$S/slurmctld.pid
SlurmdPidFile=$S/slurmd-%n.pid
SlurmctldLogFile=$S/slurmctld.log
SlurmdLogFile=$S/slurmd-%n.log
# A lost node is DOWN after 10 s; one that comes back returns to service.
SlurmdTimeout=10
ReturnToService=2
KillWait=10
# Finished jobs stay visible to scontrol for an hour (no slurmdbd here).
MinJobAge=3600
NodeName=$prefix[1-$n] NodeAddr=$kSubnet.[1-$n] CPUs=$cpus State=UNKNOWN
PartitionName=main Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
  printf 'CgroupPlugin=cgroup/v1\n' >"$S/cgroup.conf"
  # PMIx's client folder is /tmp/spmix_appdir_<uid>_<step> unless set, and
  # the hosts share /tmp; each slurmd sees its own folder at this path.
  printf 'PMIxCliTmpDirBase=%s/pmix/node\n' "$S" >"$S/mpi.conf"
}

cmd_up() {
  parse_prefix "$@"; set -- "${rest[@]+"${rest[@]}"}"
  local cpus; cpus=$(nproc)
  while [ $# -gt 0 ]; do
    case $1 in
      --cpus) cpus=${2:?--cpus needs a value}; shift 2 ;;
      *) die "up: unexpected argument '$1'" ;;
    esac
  done
  [[ $cpus =~ ^[1-9][0-9]*$ ]] || die "up: --cpus '$cpus' must be a positive integer"
  need_root; need_slurm
  [ -f "$state/hosts" ] || die "no emulated cluster '$prefix' (first: bash scripts/cluster.sh up N --rate R --prefix $prefix)"
  [ -e "$S" ] && die "Slurm is already up on cluster '$prefix' (slurm.sh down --prefix $prefix)"
  mkdir -p "$S"/{munge,ctld,spool,pmix/node}
  chmod 700 "$S" "$S/munge"
  local h
  for h in $(hosts); do mkdir -p "$S/spool/$h" "$S/pmix/$h"; done
  trap 'cmd_down --prefix "$prefix" >/dev/null 2>&1 || true' ERR
  head -c 1024 /dev/urandom >"$S/munge/munge.key"
  chmod 400 "$S/munge/munge.key"
  write_conf "$cpus"
  export SLURM_CONF=$S/slurm.conf
  munged --force --socket="$S/munge/munge.socket" --key-file="$S/munge/munge.key" \
    --log-file="$S/munge/munged.log" --pid-file="$S/munge/munged.pid" --seed-file="$S/munge/seed" ||
    die "munged did not start (see $S/munge/munged.log)"
  local h1; h1=$(first_host)
  ip netns exec "$h1" unshare --uts sh -c "hostname $h1 && exec slurmctld -f '$SLURM_CONF'" ||
    die "slurmctld did not start (see $S/slurmctld.log)"
  for h in $(hosts); do
    ip netns exec "$h" unshare --uts --mount --propagation private sh -c \
      "hostname $h && mount --bind '$S/pmix/$h' '$S/pmix/node' && exec slurmd -f '$SLURM_CONF' -N $h" ||
      die "slurmd on $h did not start (see $S/slurmd-$h.log)"
  done
  # Ready when every node is idle (registered with the controller).
  local n states
  n=$(wc -l <"$state/hosts")
  for _ in $(seq 1 60); do
    states=$(ip netns exec "$h1" sinfo -h -N -o '%T' 2>/dev/null | grep -c '^idle$' || true)
    [ "$states" = "$n" ] && break
    sleep 0.5
  done
  [ "$states" = "$n" ] || die "only $states of $n nodes became idle in 30 s (see $S/slurmctld.log, $S/slurmd-*.log)"
  trap - ERR
  echo "slurm '$prefix': slurmctld on $h1, slurmd on $(hosts | paste -sd' '); export SLURM_CONF=$SLURM_CONF"
}

cmd_down() {
  parse_prefix "$@"; [ ${#rest[@]} -eq 0 ] || die "down: unexpected argument '${rest[0]}'"
  need_root
  [ -e "$S" ] || { echo "slurm '$prefix': nothing to stop"; return 0; }
  local pids=""
  [ -f "$state/hosts" ] && pids=$(pids_of_cluster)
  if [ -n "$pids" ]; then
    kill -TERM $pids 2>/dev/null || true
    for _ in $(seq 1 25); do
      pids=$(pids_of_cluster); [ -z "$pids" ] && break; sleep 0.2
    done
    [ -n "$pids" ] && kill -KILL $pids 2>/dev/null || true
  fi
  # munged runs in the root namespace: by its pid file.
  if [ -f "$S/munge/munged.pid" ]; then
    local mp; mp=$(cat "$S/munge/munged.pid" 2>/dev/null || true)
    [ -n "$mp" ] && kill -KILL "$mp" 2>/dev/null || true
  fi
  rm -rf "$S"
  echo "slurm '$prefix': stopped"
}

cmd_run() {
  parse_prefix "$@"; set -- "${rest[@]+"${rest[@]}"}"
  [ $# -gt 0 ] || die "run: no command given"
  [ -f "$S/slurm.conf" ] || die "Slurm is not up on cluster '$prefix' (slurm.sh up --prefix $prefix)"
  exec ip netns exec "$(first_host)" env SLURM_CONF="$S/slurm.conf" "$@"
}

cmd_conf() {
  parse_prefix "$@"
  [ -f "$S/slurm.conf" ] || die "Slurm is not up on cluster '$prefix' (slurm.sh up --prefix $prefix)"
  echo "$S/slurm.conf"
}

# kill-node HOST: what a power failure does to a node: its slurmd, its step
# daemons and its ranks, all at once, with no chance to say goodbye.
cmd_kill_node() {
  local h=${1:?kill-node needs a host}
  need_root
  ip netns list 2>/dev/null | awk '{print $1}' | grep -qxF "$h" || die "no cluster host named '$h'"
  local pids; pids=$(ip netns pids "$h" 2>/dev/null || true)
  [ -n "$pids" ] && kill -KILL $pids 2>/dev/null || true
  echo "node $h: killed ($(echo $pids | wc -w) processes)"
}

sub=${1:-}; [ $# -gt 0 ] && shift
case $sub in
  up) cmd_up "$@" ;;
  down) cmd_down "$@" ;;
  run) cmd_run "$@" ;;
  conf) cmd_conf "$@" ;;
  kill-node) cmd_kill_node "$@" ;;
  ""|-h|--help|help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; [ -n "$sub" ] ;;
  *) die "unknown subcommand '$sub' (up, down, run, conf, kill-node)" ;;
esac
