#!/usr/bin/env bash
# scripts/cluster.sh: an emulated 3-host cluster of network namespaces comes
# up, hosts reach each other over the bridge, links shape, cut and heal, MPI
# launches across hosts through the netns agent, --delay fails cleanly where
# the kernel has no netem, and `down` leaves nothing behind (run twice).
# Needs root and working `ip netns`; otherwise prints SKIP and passes.
set -uo pipefail
tests=$2
cluster=$(cd "$tests/.." && pwd)/scripts/cluster.sh
failures=0
fail() { echo "FAIL $*"; failures=$((failures+1)); }
ok() { echo "ok   $*"; }

[ "$(id -u)" -eq 0 ] || { echo "SKIP: not root (network namespaces need CAP_NET_ADMIN)"; exit 0; }
command -v ip >/dev/null && command -v tc >/dev/null || { echo "SKIP: ip or tc (iproute2) not installed"; exit 0; }
probe=ttprobe$$
if ! err=$(ip netns add "$probe" 2>&1); then echo "SKIP: ip netns add fails: $err"; exit 0; fi
ip netns del "$probe"

p=tt$$          # unique prefix: hosts tt<pid>1..3, switch tt<pid>-sw
pn=${p}n        # the prefix of the --delay attempt, which must create nothing
tmp=$(mktemp -d)
cleanup() {
  bash "$cluster" down --prefix "$p" >/dev/null 2>&1
  bash "$cluster" down --prefix "$pn" >/dev/null 2>&1
  rm -rf "$tmp"
}
trap cleanup EXIT

# nothing_left PREFIX: no namespace, /etc/hosts line or state folder.
nothing_left() {
  local pre=$1 left=""
  ip netns list | awk '{print $1}' | grep -qE "^$pre(-sw|[0-9]+)$" && left+=" namespaces:$(ip netns list | awk '{print $1}' | grep -E "^$pre(-sw|[0-9]+)$" | paste -sd,)"
  grep -qE "# tessera-cluster $pre\$" /etc/hosts && left+=" /etc/hosts-lines"
  [ -e "/run/tessera-cluster/$pre" ] && left+=" state-folder"
  [ -z "$left" ] || { echo "left:$left"; return 1; }
}

# A refused --delay: one line naming netem, exit 1, nothing created. Where
# the kernel does have netem it must instead come up with a netem qdisc.
bash "$cluster" up 2 --rate 1gbit --delay 20us --prefix "$pn" >"$tmp/out" 2>"$tmp/err"; rc=$?
if [ $rc -ne 0 ]; then
  if [ $rc -eq 1 ] && [ "$(wc -l <"$tmp/err")" -eq 1 ] && grep -q "netem is not available in this kernel" "$tmp/err"; then
    ok "delay-without-netem: $(cat "$tmp/err")"
  else
    fail "delay-without-netem: exit $rc, stderr:"; cat "$tmp/err"
  fi
  if nothing_left "$pn"; then ok "delay-without-netem: nothing created"; else fail "delay-without-netem created something"; fi
else
  tc -n "${pn}1" qdisc show dev eth0 | grep -q netem && ok "delay-with-netem: netem qdisc installed" || fail "delay-with-netem: no netem qdisc"
  bash "$cluster" down --prefix "$pn" >/dev/null
fi

# Refusals: not root; a bad rate.
if command -v setpriv >/dev/null; then
  # The script is read from stdin, opened while still root: the clone may sit
  # in a folder other users cannot enter (mktemp -d makes it 0700).
  (cd / && setpriv --reuid=65534 --regid=65534 --clear-groups bash -s -- up 2 --rate 1gbit --prefix "$p" \
    <"$cluster" >/dev/null 2>"$tmp/err"); rc=$?
  [ $rc -eq 1 ] && [ "$(wc -l <"$tmp/err")" -eq 1 ] && grep -q "root" "$tmp/err" &&
    ok "not-root: $(cat "$tmp/err")" || { fail "not-root: exit $rc"; cat "$tmp/err"; }
fi
bash "$cluster" up 2 --rate fast --prefix "$p" >/dev/null 2>"$tmp/err"; rc=$?
[ $rc -eq 1 ] && grep -q "bad rate" "$tmp/err" && nothing_left "$p" && ok "bad-rate: $(cat "$tmp/err")" || { fail "bad-rate: exit $rc"; cat "$tmp/err"; }

# Up: 3 hosts at 1gbit.
if ! bash "$cluster" up 3 --rate 1gbit --prefix "$p" >"$tmp/out" 2>"$tmp/err"; then
  fail "up: exit $?"; cat "$tmp/out" "$tmp/err"; exit 1
fi
ok "up: $(head -1 "$tmp/out")"
h1=${p}1 h2=${p}2 h3=${p}3 st=/run/tessera-cluster/$p
for i in 1 2 3; do
  h=$p$i
  ip -n "$h" -o -4 addr show dev eth0 | grep -q "inet 10.99.0.$i/24" || fail "up: $h has no address 10.99.0.$i"
  tc -n "$h" qdisc show dev eth0 | grep -q "tbf.*rate 1Gbit" || fail "up: $h eth0 not shaped to 1gbit"
  tc -n "$p-sw" qdisc show dev "$h-sw" | grep -q "tbf.*rate 1Gbit" || fail "up: switch side of $h not shaped"
  grep -qE "^10\.99\.0\.${i}[[:space:]]+${h}[[:space:]]+# tessera-cluster $p\$" /etc/hosts || fail "up: no /etc/hosts line for $h"
done
[ "$(cat "$st/hostfile" 2>/dev/null)" = "$(printf '%s slots=1\n' "$h1" "$h2" "$h3")" ] && ok "up: hostfile" || fail "up: hostfile wrong: $(cat "$st/hostfile" 2>&1)"
bash "$cluster" up 2 --rate 1gbit --prefix "$p" >/dev/null 2>"$tmp/err" && fail "up-twice: should be refused" ||
  { grep -q "already exists" "$tmp/err" && ok "up-twice: $(cat "$tmp/err")" || fail "up-twice: $(cat "$tmp/err")"; }
bash "$cluster" status --prefix "$p" >"$tmp/status" 2>&1 && grep -q "$h3 10.99.0.3" "$tmp/status" && grep -q "netns-agent.sh" "$tmp/status" &&
  ok "status" || { fail "status"; cat "$tmp/status"; }

# Reachability over TCP: a python3 listener on each host, bash /dev/tcp
# clients (ping and nc may be missing).
# connect FROM TO_ADDR: a TCP connection succeeds within 3 s.
connect() { timeout 3 ip netns exec "$1" bash -c "exec 3<>/dev/tcp/$2/5001" 2>/dev/null; }
# send_ms FROM TO_ADDR BYTES: milliseconds to write BYTES to the listener.
send_ms() {
  local t0 t1; t0=$(date +%s%N)
  timeout 30 ip netns exec "$1" bash -c "exec 3<>/dev/tcp/$2/5001; head -c $3 /dev/zero >&3; exec 3>&-" || return 1
  t1=$(date +%s%N); echo $(( (t1 - t0) / 1000000 ))
}
if command -v python3 >/dev/null; then
  for h in "$h2" "$h3"; do
    ip netns exec "$h" python3 -c '
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 5001)); s.listen(8)
while True:
    c, _ = s.accept()
    while c.recv(1 << 20): pass
    c.close()' &
  done
  for _ in $(seq 50); do connect "$h1" 10.99.0.2 && connect "$h1" 10.99.0.3 && break; sleep 0.1; done
  connect "$h1" 10.99.0.2 && connect "$h1" "$h3" && connect "$h2" 10.99.0.3 && ok "reach: $h1->$h2, $h1->$h3 (by name), $h2->$h3" || fail "reach: hosts cannot connect"

  # Shape: 10 MB at 50mbit takes ~1.6 s (at least ~1 s even if a few MB sit
  # in socket buffers when the writer finishes); at 1gbit it takes ~0.1 s.
  bash "$cluster" shape "$h2" --rate 50mbit >/dev/null || fail "shape: exit $?"
  tc -n "$h2" qdisc show dev eth0 | grep -q "rate 50Mbit" && tc -n "$p-sw" qdisc show dev "$h2-sw" | grep -q "rate 50Mbit" || fail "shape: qdiscs not 50mbit"
  ms=$(send_ms "$h1" 10.99.0.2 10000000) || ms=-1
  [ "$ms" -ge 500 ] && ok "shape: 10 MB to $h2 at 50mbit took $ms ms" || fail "shape: 10 MB at 50mbit took $ms ms (want >= 500)"
  bash "$cluster" shape "$h2" --rate 1gbit >/dev/null

  # Cut and heal.
  bash "$cluster" cut "$h2" >/dev/null || fail "cut: exit $?"
  ip -n "$p-sw" -o link show "$h2-sw" | grep -q "state DOWN" || fail "cut: switch side still up"
  connect "$h1" 10.99.0.2 && fail "cut: $h1 still reaches $h2" || ok "cut: $h2 unreachable"
  connect "$h1" 10.99.0.3 && ok "cut: $h3 still reachable" || fail "cut: $h3 unreachable too"
  bash "$cluster" heal "$h2" >/dev/null || fail "heal: exit $?"
  for _ in $(seq 50); do connect "$h1" 10.99.0.2 && break; sleep 0.1; done
  connect "$h1" 10.99.0.2 && ok "heal: $h2 reachable again" || fail "heal: $h2 still unreachable"
else
  echo "note: python3 not installed; TCP reachability, shaping speed and cut/heal traffic checks skipped"
  bash "$cluster" cut "$h2" >/dev/null && ip -n "$h2" -o link show eth0 | grep -q "state DOWN" && ok "cut" || fail "cut"
  bash "$cluster" heal "$h2" >/dev/null && ok "heal" || fail "heal"
fi

# MPI across hosts through the agent; each rank reports TESSERA_HOST.
if command -v mpirun >/dev/null; then
  timeout 60 bash "$cluster" exec "$h1" mpirun --allow-run-as-root --hostfile "$st/hostfile" -np 3 \
    --mca plm_rsh_agent "$(dirname "$cluster")/netns-agent.sh" --mca btl tcp,self \
    --mca btl_tcp_if_include 10.99.0.0/24 --mca oob_tcp_if_include 10.99.0.0/24 \
    sh -c 'echo "$TESSERA_HOST $(ip -o -4 addr show dev eth0 | awk "{print \$4}")"' >"$tmp/mpi" 2>"$tmp/mpi.err"
  # (stderr may carry a harmless "plm:rsh: setpgid ... failed" warning)
  [ "$(sort "$tmp/mpi")" = "$(printf '%s 10.99.0.%s/24\n' "$h1" 1 "$h2" 2 "$h3" 3)" ] &&
    ok "mpirun: one rank on each host" || { fail "mpirun across hosts:"; cat "$tmp/mpi" "$tmp/mpi.err"; }
fi

# Down, then nothing left; down again is a no-op.
bash "$cluster" down --prefix "$p" >"$tmp/out" 2>&1 || { fail "down: exit $?"; cat "$tmp/out"; }
if nothing_left "$p"; then ok "down: nothing left"; else fail "down left something"; fi
bash "$cluster" down --prefix "$p" >"$tmp/out" 2>&1 && grep -q "nothing to remove" "$tmp/out" &&
  ok "down-twice: $(cat "$tmp/out")" || { fail "down-twice"; cat "$tmp/out"; }
wait 2>/dev/null   # the listeners ended with their namespaces

[ $failures -eq 0 ] && echo "all passed" || echo "$failures failed"
[ $failures -eq 0 ]
