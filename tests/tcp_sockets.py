"""Which TCP connections this machine has made to a port, from the kernel's table
(``/proc/net/tcp``): how tests and benches count the connections clients open to a
broker, closed ones included (a closing client's side lingers in TIME_WAIT for a minute)."""

from __future__ import annotations

from pathlib import Path

_LISTEN = "0A"


def client_ports(port: int) -> set[int]:
    """Local ports of the sockets connected to ``port`` on any address, in any state but
    listening: one per connection a client opened there in the last minute or so."""
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        path = Path(table)
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            local, remote, state = fields[1], fields[2], fields[3]
            if state != _LISTEN and int(remote.rsplit(":", 1)[1], 16) == port:
                ports.add(int(local.rsplit(":", 1)[1], 16))
    return ports
