#!/usr/bin/env bash
# mpirun remote-shell agent for the emulated cluster of scripts/cluster.sh:
#   --mca plm_rsh_agent /path/to/scripts/netns-agent.sh
# mpirun calls it like ssh: `AGENT [-options] HOST command...`. Instead of
# logging in, it runs the command inside the network namespace named HOST,
# with TESSERA_HOST=HOST in its environment. HOST may also be an address of a
# cluster host (looked up in /run/tessera-cluster/*/hosts) or user@HOST.
set -euo pipefail
while [ $# -gt 0 ] && [ "${1#-}" != "$1" ]; do shift; done
if [ $# -lt 2 ]; then
  echo "netns-agent: usage: netns-agent.sh [-options] HOST command..." >&2; exit 2
fi
host=${1#*@}; shift
if ! ip netns list | awk '{print $1}' | grep -qxF "$host"; then
  # An address or alias: map it through the cluster state files.
  name=$(awk -v h="$host" '$2 == h {print $1; exit}' /run/tessera-cluster/*/hosts 2>/dev/null || true)
  if [ -z "$name" ]; then
    echo "netns-agent: no network namespace for host '$host'" >&2; exit 255
  fi
  host=$name
fi
# OpenMPI 4.1's orted sometimes segfaults in hwloc_shmem_topology_write when
# several daemons share one machine (2 in 20 launches here); not mapping the
# shared topology (vmhole none) avoids it. mpirun's own -mca flags still win.
# Every namespace host has the machine's hostname and /tmp, so two daemons
# would race to create one session folder /tmp/ompi.HOSTNAME.UID/jf.N and one
# loses with "mkdir: File exists" (seen in CI); each host gets its own base.
tmpbase=${OMPI_MCA_orte_tmpdir_base:-/tmp/tessera-netns/$host}
mkdir -p "$tmpbase"
# The command (OpenMPI's daemon) runs as this agent's child, and a watcher
# process watches the agent's parent, mpirun (issue #18 item 6). A host cut
# for good leaves its daemon unable to reach mpirun: with data in flight, TCP
# gives up only after net.ipv4.tcp_retries2 retransmissions (about 15
# minutes), so the daemon and its ranks would live on. When mpirun is gone
# (it ended, or `tessera launch` ended it after the job failed), the watcher
# ends the daemon and every process under it. The watcher is a process of
# its own because mpirun may kill the agent with SIGKILL when it gives up on
# a daemon. On real hosts ssh plays this part: sshd ends the session when the
# connection dies (ClientAliveInterval; docs/cluster.md).
# stdin is passed on explicitly: a background command would get /dev/null.
ip netns exec "$host" env TESSERA_HOST="$host" \
  OMPI_MCA_rtc_hwloc_vmhole="${OMPI_MCA_rtc_hwloc_vmhole:-none}" \
  OMPI_MCA_orte_tmpdir_base="$tmpbase" sh -c "$*" 0<&0 &
child=$!
parent=$PPID
# start_time PID: the process's start time (field 22 of /proc/PID/stat), so
# that a new process given a dead one's pid is not taken for it.
start_time() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  stat=${stat##*) }  # the fields after the command name, from the state on
  set -- $stat
  echo "${20}"
}
# descendants PID: every process under PID, children after their parents.
descendants() {
  local p
  for p in $(pgrep -P "$1"); do echo "$p"; descendants "$p"; done
}
parent_start=$(start_time "$parent" || echo gone)
(
  trap '' TERM INT HUP
  while kill -0 "$child" 2>/dev/null; do
    if [ "$(start_time "$parent" || echo gone)" != "$parent_start" ]; then
      # Collect the tree before any of it dies (orphans move to init).
      tree=$(descendants "$child")
      kill -KILL "$child" $tree 2>/dev/null || true
      echo "netns-agent: mpirun is gone; ended the job's processes on host $host" >&2
      break
    fi
    sleep 0.5
  done
) </dev/null &
# To the whole tree: sh may not exec the daemon, and ending only sh would
# leave the daemon to init (and end the watcher's loop).
trap 'kill -TERM $(descendants "$child") "$child" 2>/dev/null' TERM INT HUP
# wait returns early when a trapped signal arrives: wait again until the
# command has ended, then pass its status on.
while :; do
  rc=0; wait "$child" || rc=$?
  kill -0 "$child" 2>/dev/null || exit "$rc"
done
