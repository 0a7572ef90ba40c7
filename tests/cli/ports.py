"""Loopback ports for the CLI tests (tests/ports.h does the same in C++).

Servers under test mostly take --port 0, so the kernel hands them a port from
its ephemeral range (/proc/sys/net/ipv4/ip_local_port_range). A test that
needs a port of its own picks it outside that range, or a server of a test
running beside it may take the port between the pick and its use.

    python3 ports.py free           print a port free on 127.0.0.1 now
    python3 ports.py hold FILE PID  hold a port bound without listen() (a
                                    connection is refused at once, and no
                                    other process can bind it), write it to
                                    FILE, and keep it until process PID is gone

route_drill.py imports free_port from here.
"""
import os
import random
import socket
import sys
import time


def bind_unshared():
    """A socket bound to 127.0.0.1 on a port outside the ephemeral range (in
    20000-32000 where possible), or None."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lo, hi = map(int, f.read().split())
    except (OSError, ValueError):
        lo, hi = 32768, 60999
    ports = [p for p in range(20000, 32001) if p < lo or p > hi]
    ports = ports or [p for p in range(10000, 65536) if p < lo or p > hi]
    random.shuffle(ports)
    for p in ports[:500]:
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", p))
            return s
        except OSError:
            s.close()
    return None


def free_port():
    s = bind_unshared()
    if s is None:
        raise SystemExit("ports.py: no free port outside the ephemeral range")
    with s:
        return s.getsockname()[1]


def hold(out, pid):
    s = bind_unshared()
    if s is None:
        raise SystemExit("ports.py: no free port outside the ephemeral range")
    with open(out + ".part", "w") as f:
        f.write(str(s.getsockname()[1]))
    os.rename(out + ".part", out)
    while True:  # until the test's shell is gone
        try:
            os.kill(pid, 0)
        except OSError:
            return
        time.sleep(0.5)


if __name__ == "__main__":
    if sys.argv[1:2] == ["free"] and len(sys.argv) == 2:
        print(free_port())
    elif sys.argv[1:2] == ["hold"] and len(sys.argv) == 4:
        hold(sys.argv[2], int(sys.argv[3]))
    else:
        raise SystemExit("usage: ports.py free | ports.py hold FILE PID")
