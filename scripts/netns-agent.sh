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
exec ip netns exec "$host" env TESSERA_HOST="$host" \
  OMPI_MCA_rtc_hwloc_vmhole="${OMPI_MCA_rtc_hwloc_vmhole:-none}" \
  OMPI_MCA_orte_tmpdir_base="$tmpbase" sh -c "$*"
