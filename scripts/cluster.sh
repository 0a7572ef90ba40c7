#!/usr/bin/env bash
# An emulated cluster on one machine: N hosts, each a Linux network namespace,
# joined by veth links to a bridge in a "switch" namespace, every link shaped
# with tc. See docs/cluster.md.
#
#   cluster.sh up N --rate R [--delay D] [--loss P] [--prefix NAME]
#   cluster.sh down [--prefix NAME]
#   cluster.sh shape HOST [--rate R] [--delay D] [--loss P]
#   cluster.sh cut HOST | heal HOST
#   cluster.sh status [--prefix NAME]
#   cluster.sh exec HOST command...
#   cluster.sh agent [-options] HOST command...   (mpirun's plm_rsh_agent)
#
# Everything lives inside namespaces this script creates; the root namespace's
# interfaces and routes are never touched. Errors: one line on stderr, exit 1.
set -euo pipefail

readonly kStateRoot=/run/tessera-cluster
readonly kSubnet=10.99.0            # hosts are $kSubnet.1 .. $kSubnet.N, /24
readonly kHostsFile=/etc/hosts
readonly kTag="# tessera-cluster"   # trailing comment on our /etc/hosts lines
readonly kLatency=50ms              # tbf: longest a packet may wait in the queue
here=$(cd "$(dirname "${BASH_SOURCE[0]:-$0}")" && pwd)  # $0 when read from stdin
readonly agent_path=$here/netns-agent.sh

die() { echo "cluster.sh: error: $*" >&2; exit 1; }
need_root() { [ "$(id -u)" -eq 0 ] || die "must run as root (network namespaces need CAP_NET_ADMIN)"; }
ns_exists() { ip netns list 2>/dev/null | awk '{print $1}' | grep -qxF "$1"; }

# rate_bits R: bits per second of a tc rate like 100mbit, 25gbit, 1.5gbit.
rate_bits() {
  [[ $1 =~ ^([0-9]+(\.[0-9]+)?)(bit|kbit|mbit|gbit|tbit)$ ]] ||
    die "bad rate '$1' (want a number and bit|kbit|mbit|gbit|tbit, e.g. 10gbit)"
  local mult
  case ${BASH_REMATCH[3]} in
    bit) mult=1 ;; kbit) mult=1e3 ;; mbit) mult=1e6 ;; gbit) mult=1e9 ;; tbit) mult=1e12 ;;
  esac
  local bits
  bits=$(awk -v n="${BASH_REMATCH[1]}" -v m="$mult" 'BEGIN { printf "%.0f", n * m }')
  [ "$bits" -ge 8000 ] || die "bad rate '$1' (want at least 8kbit)"
  echo "$bits"
}

# burst_bytes R: tbf bucket size, one millisecond at the rate, at least 4000
# bytes (32kbit) so a full-size frame always fits.
burst_bytes() {
  local bits; bits=$(rate_bits "$1")
  awk -v b="$bits" 'BEGIN { x = b / 8 / 1000; if (x < 4000) x = 4000; printf "%.0f", x }'
}

check_delay() { [[ -z $1 || $1 =~ ^[0-9]+(\.[0-9]+)?(us|ms|s)$ ]] || die "bad delay '$1' (want e.g. 20us, 1ms)"; }
check_loss() { [[ -z $1 || $1 =~ ^[0-9]+(\.[0-9]+)?%?$ ]] || die "bad loss '$1' (want a percentage, e.g. 0.1%)"; }

# probe_netns [WANT_NETEM]: a throwaway namespace proves `ip netns` works and,
# when asked, that the kernel has the netem qdisc. Leaves nothing behind.
probe_netns() {
  local probe=tessera-probe-$$ err
  if ! err=$(ip netns add "$probe" 2>&1); then
    die "ip netns does not work here: ${err//$'\n'/ }"
  fi
  local netem_ok=1
  if [ "${1:-}" = netem ]; then
    ip -n "$probe" link set lo up 2>/dev/null || true
    tc -n "$probe" qdisc add dev lo root netem delay 1ms >/dev/null 2>&1 || netem_ok=0
  fi
  ip netns del "$probe" 2>/dev/null || true
  [ $netem_ok -eq 1 ] ||
    die "--delay/--loss need the netem qdisc, but netem is not available in this kernel (tc: 'Specified qdisc kind is unknown'); only --rate can be emulated here"
}

# shape_dev NS DEV RATE DELAY LOSS: replace DEV's egress qdisc. Rate alone:
# one tbf. With delay or loss: netem at the root, tbf under it.
shape_dev() {
  local ns=$1 dev=$2 rate=$3 delay=$4 loss=$5 burst
  burst=$(burst_bytes "$rate")
  tc -n "$ns" qdisc del dev "$dev" root >/dev/null 2>&1 || true
  if [ -n "$delay$loss" ]; then
    local args=()
    [ -n "$delay" ] && args+=(delay "$delay")
    [ -n "$loss" ] && args+=(loss "${loss%\%}%")
    tc -n "$ns" qdisc add dev "$dev" root handle 1: netem "${args[@]}" limit 100000
    tc -n "$ns" qdisc add dev "$dev" parent 1:1 handle 10: tbf rate "$rate" burst "$burst" latency $kLatency
  else
    tc -n "$ns" qdisc add dev "$dev" root handle 1: tbf rate "$rate" burst "$burst" latency $kLatency
  fi
}

# hosts_edit: drop our tagged lines for PREFIX from /etc/hosts, then append
# stdin. Rewritten in place (cat >), since /etc/hosts is often a bind mount;
# serialised by a lock so two clusters can come up at once.
hosts_edit() {
  local prefix=$1 tmp; tmp=$(mktemp)
  mkdir -p "$kStateRoot"
  {
    flock 9
    grep -vE "[[:space:]]$kTag $prefix\$" "$kHostsFile" >"$tmp" || true
    cat >>"$tmp"
    cat "$tmp" >"$kHostsFile"
  } 9>"$kStateRoot/.lock"
  rm -f "$tmp"
}

# find_host HOST: sets prefix, sw (switch namespace) and state for the cluster
# that holds HOST.
find_host() {
  local h=$1 f
  for f in "$kStateRoot"/*/hosts; do
    [ -f "$f" ] || continue
    if awk -v h="$h" '$1 == h {found = 1} END {exit !found}' "$f"; then
      state=$(dirname "$f"); prefix=$(basename "$state"); sw=$prefix-sw
      return 0
    fi
  done
  die "no cluster host named '$h' (see: cluster.sh status)"
}

# conf_get KEY: a value from $state/config.
conf_get() { awk -F= -v k="$1" '$1 == k {sub(/^[^=]*=/, ""); print; exit}' "$state/config"; }

# undo_up: the EXIT trap while `up` builds: on failure, remove what exists.
undo_up() {
  local rc=$?
  if [ $rc -ne 0 ]; then
    echo "cluster.sh: up failed, removing the partial cluster" >&2
    cmd_down --prefix "$up_prefix" >/dev/null 2>&1 || true
    exit 1
  fi
}

cmd_up() {
  local n="" rate="" delay="" loss="" prefix=tess
  while [ $# -gt 0 ]; do
    case $1 in
      --rate) rate=${2:?--rate needs a value}; shift 2 ;;
      --delay) delay=${2:?--delay needs a value}; shift 2 ;;
      --loss) loss=${2:?--loss needs a value}; shift 2 ;;
      --prefix) prefix=${2:?--prefix needs a value}; shift 2 ;;
      -*) die "up: unknown flag '$1'" ;;
      *) [ -z "$n" ] || die "up: unexpected argument '$1'"; n=$1; shift ;;
    esac
  done
  need_root
  [[ $n =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le 250 ] || die "up: want a host count 1..250, got '${n}'"
  [ -n "$rate" ] || die "up: --rate is required (e.g. --rate 10gbit)"
  rate_bits "$rate" >/dev/null
  check_delay "$delay"; check_loss "$loss"
  [[ $prefix =~ ^[a-z][a-z0-9]*$ ]] || die "up: prefix '$prefix' must be lower-case letters and digits, starting with a letter"
  # The switch-side veth is named HOST-sw, and interface names are <= 15 chars.
  [ $(( ${#prefix} + ${#n} )) -le 12 ] || die "up: prefix '$prefix' too long for $n hosts (host names must be <= 12 characters)"
  if [ -n "$delay$loss" ]; then probe_netns netem; else probe_netns; fi

  local sw=$prefix-sw
  state=$kStateRoot/$prefix
  if [ -e "$state" ] || ns_exists "$sw"; then
    die "a cluster with prefix '$prefix' already exists (cluster.sh down --prefix $prefix)"
  fi
  local i host addr
  for i in $(seq 1 "$n"); do
    ns_exists "$prefix$i" && die "a network namespace named '$prefix$i' already exists; choose another --prefix"
  done
  mkdir -p "$kStateRoot"
  mkdir "$state" 2>/dev/null || die "a cluster with prefix '$prefix' already exists (cluster.sh down --prefix $prefix)"
  # From here on a failure undoes everything this call created.
  up_prefix=$prefix
  trap undo_up EXIT

  printf 'prefix=%s\nswitch=%s\nbridge=br0\nsubnet=%s.0/24\nrate=%s\ndelay=%s\nloss=%s\nhosts=%s\n' \
    "$prefix" "$sw" "$kSubnet" "$rate" "$delay" "$loss" "$n" >"$state/config"
  : >"$state/hosts"; : >"$state/hostfile"

  ip netns add "$sw"
  ip -n "$sw" link set lo up
  ip -n "$sw" link add br0 type bridge
  ip -n "$sw" link set br0 up

  for i in $(seq 1 "$n"); do
    host=$prefix$i; addr=$kSubnet.$i
    ip netns add "$host"
    echo "$host $addr" >>"$state/hosts"   # recorded at once, so down finds it
    # Both ends are created directly inside their namespaces.
    ip link add name eth0 netns "$host" type veth peer name "$host-sw" netns "$sw"
    ip -n "$host" link set lo up
    ip -n "$host" addr add "$addr/24" dev eth0
    ip -n "$host" link set eth0 up
    ip -n "$sw" link set "$host-sw" master br0
    ip -n "$sw" link set "$host-sw" up
    shape_dev "$host" eth0 "$rate" "$delay" "$loss"
    shape_dev "$sw" "$host-sw" "$rate" "$delay" "$loss"
    echo "$host slots=1" >>"$state/hostfile"
  done
  awk -v tag="$kTag $prefix" '{print $2 "\t" $1 "\t" tag}' "$state/hosts" | hosts_edit "$prefix"
  trap - EXIT

  echo "cluster '$prefix': $n hosts ($(awk '{print $1}' "$state/hosts" | paste -sd' ')) on $kSubnet.0/24, links $rate${delay:+ delay $delay}${loss:+ loss $loss}"
  echo "hostfile: $state/hostfile"
  echo "agent:    $agent_path"
}

cmd_down() {
  local prefix=tess
  while [ $# -gt 0 ]; do
    case $1 in
      --prefix) prefix=${2:?--prefix needs a value}; shift 2 ;;
      *) die "down: unexpected argument '$1'" ;;
    esac
  done
  need_root
  local st=$kStateRoot/$prefix
  # A Slurm on the cluster (scripts/slurm.sh) stops first: munged lives in
  # the root namespace, and its daemons' folders are in the state folder.
  if [ -d "$st/slurm" ]; then "$here/slurm.sh" down --prefix "$prefix" >/dev/null 2>&1 || true; fi
  # Namespaces: the switch, the hosts in the state file, and (in case the
  # state folder was lost) the hosts named by our /etc/hosts lines.
  local ns removed=0
  for ns in $( {
      echo "$prefix-sw"
      [ -f "$st/hosts" ] && awk '{print $1}' "$st/hosts"
      grep -E "[[:space:]]$kTag $prefix\$" "$kHostsFile" | awk '{print $2}'
    } | awk 'NF && !seen[$0]++'); do
    ns_exists "$ns" || continue
    # Processes left inside (e.g. a hung rank) would keep the namespace and its
    # veth alive after its name is gone, so end them first.
    local pids; pids=$(ip netns pids "$ns" 2>/dev/null || true)
    if [ -n "$pids" ]; then
      kill -TERM $pids 2>/dev/null || true
      for _ in 1 2 3 4 5 6 7 8 9 10; do
        pids=$(ip netns pids "$ns" 2>/dev/null || true); [ -z "$pids" ] && break; sleep 0.2
      done
      [ -n "$pids" ] && kill -KILL $pids 2>/dev/null || true
    fi
    ip netns del "$ns"
    removed=$((removed + 1))
  done
  if grep -qE "[[:space:]]$kTag $prefix\$" "$kHostsFile"; then
    hosts_edit "$prefix" </dev/null; removed=$((removed + 1))
  fi
  if [ -e "$st" ]; then rm -rf "$st"; removed=$((removed + 1)); fi
  if [ $removed -eq 0 ]; then
    echo "cluster '$prefix': nothing to remove"
  else
    echo "cluster '$prefix': removed"
  fi
}

cmd_shape() {
  local host=${1:-} rate="" delay="" loss=""
  [ -n "$host" ] && [ "${host#-}" = "$host" ] || die "shape: usage: cluster.sh shape HOST [--rate R] [--delay D] [--loss P]"
  shift
  while [ $# -gt 0 ]; do
    case $1 in
      --rate) rate=${2:?--rate needs a value}; shift 2 ;;
      --delay) delay=${2:?--delay needs a value}; shift 2 ;;
      --loss) loss=${2:?--loss needs a value}; shift 2 ;;
      *) die "shape: unexpected argument '$1'" ;;
    esac
  done
  need_root
  find_host "$host"
  [ -n "$rate" ] || rate=$(conf_get rate)
  rate_bits "$rate" >/dev/null
  check_delay "$delay"; check_loss "$loss"
  if [ -n "$delay$loss" ]; then probe_netns netem; fi
  shape_dev "$host" eth0 "$rate" "$delay" "$loss"
  shape_dev "$sw" "$host-sw" "$rate" "$delay" "$loss"
  echo "$host: link $rate${delay:+ delay $delay}${loss:+ loss $loss}"
}

cmd_link() {  # cmd_link up|down HOST
  local updown=$1 host=${2:-}
  [ -n "$host" ] || die "usage: cluster.sh cut|heal HOST"
  need_root
  find_host "$host"
  ip -n "$sw" link set "$host-sw" "$updown"
  ip -n "$host" link set eth0 "$updown"
  if [ "$updown" = down ]; then echo "$host: link cut"; else echo "$host: link healed"; fi
}

cmd_status() {
  local only=""
  while [ $# -gt 0 ]; do
    case $1 in
      --prefix) only=${2:?--prefix needs a value}; shift 2 ;;
      *) die "status: unexpected argument '$1'" ;;
    esac
  done
  need_root
  local f any=0
  for f in "$kStateRoot"/*/config; do
    [ -f "$f" ] || continue
    state=$(dirname "$f"); prefix=$(basename "$state"); sw=$prefix-sw
    [ -z "$only" ] || [ "$only" = "$prefix" ] || continue
    any=1
    echo "cluster '$prefix': switch namespace $sw (bridge br0), subnet $(conf_get subnet), rate $(conf_get rate)"
    echo "  state:    $state"
    echo "  hostfile: $state/hostfile"
    echo "  agent:    $agent_path"
    local host addr
    while read -r host addr; do
      local hstate sstate hq sq
      hstate=$(ip -n "$host" -o link show eth0 2>/dev/null | grep -o 'state [A-Z]*' || echo "state MISSING")
      sstate=$(ip -n "$sw" -o link show "$host-sw" 2>/dev/null | grep -o 'state [A-Z]*' || echo "state MISSING")
      hq=$(tc -n "$host" qdisc show dev eth0 2>/dev/null | paste -sd';' || true)
      sq=$(tc -n "$sw" qdisc show dev "$host-sw" 2>/dev/null | paste -sd';' || true)
      echo "  $host $addr"
      echo "    host   eth0 ${hstate#state }: $hq"
      echo "    switch $host-sw ${sstate#state }: $sq"
    done <"$state/hosts"
  done
  if [ $any -eq 0 ]; then echo "no clusters${only:+ with prefix '$only'}"; fi
}

cmd_exec() {
  local host=${1:-}
  [ -n "$host" ] && [ $# -ge 2 ] || die "usage: cluster.sh exec HOST command..."
  shift
  need_root
  ns_exists "$host" || die "no network namespace named '$host'"
  exec ip netns exec "$host" env TESSERA_HOST="$host" "$@"
}

sub=${1:-}
[ $# -gt 0 ] && shift
case $sub in
  up) cmd_up "$@" ;;
  down) cmd_down "$@" ;;
  shape) cmd_shape "$@" ;;
  cut) cmd_link down "$@" ;;
  heal) cmd_link up "$@" ;;
  status) cmd_status "$@" ;;
  exec) cmd_exec "$@" ;;
  agent) exec "$agent_path" "$@" ;;
  ""|-h|--help|help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; [ -n "$sub" ] ;;
  *) die "unknown subcommand '$sub' (up, down, shape, cut, heal, status, exec, agent)" ;;
esac
