"""Test hosts for the chaos suite: one network namespace per host, on one bridge.

Every member, name server and controller of a chaos run gets a host of its own: a network
namespace with one veth leg on a bridge in the root namespace and its own address
``10.<a>.<b>.<i>``, so a partition is a property of the network between processes, not of
the processes. The runner's clients and proxies stay in the root namespace and bind the
bridge's address (``client_address``); they reach every host whatever the partition, the
way Jepsen's control node does.

Faults are made the way a real network makes them:

* a cut between two hosts (``partition``, ``cut``) gives each of them a permanent
  neighbour entry for the other's address with a MAC address nobody owns: frames between
  the two are sent and silently lost on the bridge. Established TCP connections stall and
  retransmit, new connects time out — a partition without ICMP, the common case. Blackhole,
  unreachable and prohibit routes were measured and rejected: with each, an established
  connection stalls too, but every new ``connect()`` fails at once inside the sender
  (EINVAL, EHOSTUNREACH or EACCES), which hides every timeout path a real partition takes;
* ``isolate`` takes the host's leg down on the bridge side (a pulled cable): nobody, the
  runner's clients included, reaches it until ``heal``.

Names are unique per run and short enough for interface names (15 characters):
``hqc<pid: 5 base-36 digits><counter: 2>`` then ``br`` (the bridge), ``n<i>`` (a
namespace) or ``v<i>`` (its veth leg). The pid in every name lets a later run remove what
a killed run left behind (``close`` runs at exit too, but not after SIGKILL). Where
namespaces cannot be made (no root, no ``ip``), ``make_hosts`` falls back to
``LoopbackHosts``: a distinct 127.x.y.i per host and no network faults (frame loss,
delay and duplication through ``FrameProxy`` still work).
"""

from __future__ import annotations

import atexit
import itertools
import os
import random
import re
import subprocess
from abc import ABC, abstractmethod
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from ipaddress import IPv4Network, ip_network

# One address per host, so every service listens on its well-known port.
NAMESRV_PORT = 9876
BROKER_PORT = 10911  # its HA port is BROKER_PORT + 1
DLEDGER_PORT = 40911
CONTAINER_PORT = 10811

PREFIX = "hqc"  # every namespace and link a run makes starts with it
_PID_DIGITS = 5  # base-36 digits of a pid: 36**5 > 2**22, Linux's largest pid
_MAX_HOSTS = 253  # host addresses .2 .. .254 of the run's /24
_DEAD_MAC = "02:00:00:00:00:00"  # locally administered and never assigned: frames go nowhere
_IP_TIMEOUT_S = 20.0
_SUBNET_TRIES = 200
_counter = itertools.count()


class HostsError(Exception):
    """An ``ip`` command failed, or a host name is unknown or taken."""


class Unsupported(HostsError):
    """The fault needs network namespaces and this run has none (``LoopbackHosts``)."""


@dataclass(frozen=True)
class Host:
    name: str
    address: str  # the IP its processes bind


class Hosts(ABC):
    """The hosts of one run; ``make_hosts`` picks the implementation."""

    kind: str
    client_address: str

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self._hosts: dict[str, Host] = {}

    def add(self, name: str) -> Host:
        if not name or not name.isprintable() or "/" in name or " " in name:
            raise HostsError(f"host name must be printable without '/' or spaces, got {name!r}")
        if name in self._hosts:
            raise HostsError(f"host {name!r} exists already")
        if len(self._hosts) >= _MAX_HOSTS:
            raise HostsError(f"at most {_MAX_HOSTS} hosts per run")
        host = Host(name, self._make(name, len(self._hosts) + 2))
        self._hosts[name] = host
        return host

    def host(self, name: str) -> Host:
        try:
            return self._hosts[name]
        except KeyError:
            raise HostsError(f"no host {name!r}; hosts are {sorted(self._hosts)}") from None

    def partition(self, sides: Sequence[Collection[str]]) -> None:
        """Hosts on different sides cannot reach each other, in either direction; hosts
        named on no side keep every link, and the runner's clients reach every host."""
        seen: set[str] = set()
        for side in sides:
            for name in side:
                self.host(name)
                if name in seen:
                    raise HostsError(f"host {name!r} is on two sides of a partition")
                seen.add(name)
        self.cut(
            (x, y)
            for i, side in enumerate(sides)
            for other in sides[i + 1 :]
            for x in side
            for y in other
        )

    @abstractmethod
    def _make(self, name: str, index: int) -> str:
        """Create the host with its index in the run (2..254); returns its address."""

    @abstractmethod
    def command(self, host: str, argv: list[str]) -> list[str]:
        """``argv`` run inside ``host``."""

    @abstractmethod
    def cut(self, pairs: Iterable[tuple[str, str]]) -> None:
        """Each pair loses its link, both directions: any shape (ring, bridge, ...)."""

    @abstractmethod
    def isolate(self, host: str) -> None:
        """Link down: nobody reaches ``host``, the runner's clients included."""

    @abstractmethod
    def heal(self) -> None:
        """Every cut and isolation undone."""

    @abstractmethod
    def close(self) -> None:
        """Remove everything the run made; idempotent."""


class NetnsHosts(Hosts):
    kind = "netns"

    def __init__(self, run_id: str) -> None:
        super().__init__(run_id)
        remove_stale()
        # Every namespace and link of this run starts with it.
        self.prefix = _owned_prefix() + _base36(next(_counter) % 36**2, 2)
        self._bridge = f"{self.prefix}br"
        self._subnet = _free_subnet()
        self.client_address = str(self._subnet.network_address + 1)
        self._namespaces: dict[str, str] = {}  # host -> namespace
        self._legs: dict[str, str] = {}  # host -> its veth's end on the bridge
        self._cuts: set[frozenset[str]] = set()
        self._isolated: set[str] = set()
        self._closed = False
        atexit.register(self.close)
        try:
            _ip("link", "add", self._bridge, "type", "bridge")
            # Says which run made the bridge to whoever reads `ip -d link`.
            _ip("link", "set", self._bridge, "alias", f"hamq chaos {self.run_id} pid {os.getpid()}")
            _ip("addr", "add", f"{self.client_address}/24", "dev", self._bridge)
            _ip("link", "set", self._bridge, "up")
        except BaseException:
            self.close()
            raise

    def _make(self, name: str, index: int) -> str:
        namespace, leg = f"{self.prefix}n{index}", f"{self.prefix}v{index}"
        address = str(self._subnet.network_address + index)
        self._namespaces[name], self._legs[name] = namespace, leg
        _ip("netns", "add", namespace)
        _ip("link", "add", leg, "type", "veth", "peer", "name", "eth0", "netns", namespace)
        _ip("link", "set", leg, "master", self._bridge, "up")
        _ip("-n", namespace, "addr", "add", f"{address}/24", "dev", "eth0")
        _ip("-n", namespace, "link", "set", "eth0", "up")
        _ip("-n", namespace, "link", "set", "lo", "up")
        return address

    def command(self, host: str, argv: list[str]) -> list[str]:
        self.host(host)
        return ["ip", "netns", "exec", self._namespaces[host], *argv]

    def cut(self, pairs: Iterable[tuple[str, str]]) -> None:
        for x, y in pairs:
            if x == y:
                raise HostsError(f"cannot cut host {x!r} from itself")
            self._blind(x, y)
            self._blind(y, x)
            self._cuts.add(frozenset((x, y)))

    def isolate(self, host: str) -> None:
        _ip("link", "set", self._leg(host), "down")
        self._isolated.add(host)

    def heal(self) -> None:
        for pair in sorted(self._cuts, key=sorted):
            x, y = sorted(pair)
            _ip("-n", self._namespaces[x], "neigh", "del", self.host(y).address, "dev", "eth0")
            _ip("-n", self._namespaces[y], "neigh", "del", self.host(x).address, "dev", "eth0")
            self._cuts.discard(pair)
        for host in sorted(self._isolated):
            _ip("link", "set", self._leg(host), "up")
            self._isolated.discard(host)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        # Deleting a leg deletes its peer; a namespace still holding processes would keep
        # its end alive, so the legs go first, then the namespaces, then the bridge.
        _remove([*self._legs.values(), self._bridge], list(self._namespaces.values()))

    def _blind(self, host: str, peer: str) -> None:
        """``host`` sends what it means for ``peer`` to a MAC address nobody has."""
        _ip("-n", self._namespaces[host], "neigh", "replace", self.host(peer).address,
            "lladdr", _DEAD_MAC, "nud", "permanent", "dev", "eth0")  # fmt: skip

    def _leg(self, host: str) -> str:
        self.host(host)
        return self._legs[host]


class LoopbackHosts(Hosts):
    """Distinct loopback addresses (127.x.y.i): real processes and sockets, no network
    faults. ``x.y`` come from the pid so that concurrent runs do not share addresses."""

    kind = "loopback"
    client_address = "127.0.0.1"

    def __init__(self, run_id: str) -> None:
        super().__init__(run_id)
        seed = os.getpid() * 64 + next(_counter) % 64
        self._net = f"127.{1 + seed % 254}.{(seed // 254) % 256}"

    def _make(self, name: str, index: int) -> str:
        return f"{self._net}.{index}"

    def command(self, host: str, argv: list[str]) -> list[str]:
        self.host(host)
        return list(argv)

    def cut(self, pairs: Iterable[tuple[str, str]]) -> None:
        raise Unsupported(_NO_NETNS.format(what="a cut between hosts"))

    def partition(self, sides: Sequence[Collection[str]]) -> None:
        raise Unsupported(_NO_NETNS.format(what="a partition"))

    def isolate(self, host: str) -> None:
        raise Unsupported(_NO_NETNS.format(what="isolating a host"))

    def heal(self) -> None:
        """Nothing can have been cut."""

    def close(self) -> None:
        """Loopback addresses need no removal."""


_NO_NETNS = (
    "{what} needs network namespaces; this run uses loopback hosts because `ip netns add` "
    "failed (run as root with iproute2 for the netns hosts)"
)


def make_hosts(run_id: str, prefer: str = "netns") -> Hosts:
    """``NetnsHosts`` when namespaces can be made here (a probe creates and deletes one),
    else ``LoopbackHosts``; ``kind`` says which, for the runner to print and record."""
    if prefer not in ("netns", "loopback"):
        raise HostsError(f"prefer must be 'netns' or 'loopback', got {prefer!r}")
    if prefer == "netns" and netns_available():
        return NetnsHosts(run_id)
    return LoopbackHosts(run_id)


def netns_available() -> bool:
    probe = f"{_owned_prefix()}p"
    try:
        _ip("netns", "add", probe)
    except (HostsError, OSError):
        return False
    _ip("netns", "del", probe)
    return True


def remove_stale() -> None:
    """Remove namespaces and links left by runs whose process is gone (SIGKILLed runs,
    this run id's earlier attempt included): their names carry the pid that made them."""
    links = [n for n in _names("-o", "link", "show") if _owner_gone(n)]
    namespaces = [n for n in _names("netns", "list") if _owner_gone(n)]
    if links or namespaces:
        _remove(links, namespaces)


def _remove(links: list[str], namespaces: list[str]) -> None:
    """Delete links then namespaces, carrying on past those already gone; one error at the
    end names what could not be removed."""
    failed: list[str] = []
    for args in [("link", "del", name) for name in links] + [
        ("netns", "del", name) for name in namespaces
    ]:
        try:
            _ip(*args)
        except HostsError as exc:
            if not _gone(str(exc)):
                failed.append(str(exc))
    if failed:
        raise HostsError("; ".join(failed))


def _gone(message: str) -> bool:
    return "Cannot find device" in message or "No such file" in message


def _names(*args: str) -> list[str]:
    """Our names in the output of ``ip link show -o`` or ``ip netns list``."""
    names = []
    for line in _ip(*args).splitlines():
        fields = line.split()
        if not fields:
            continue
        # `ip -o link`: "7: hqc...v2@if3: <...>"; `ip netns list`: "hqc...n2 (id: 0)"
        name = fields[1] if args[0] == "-o" else fields[0]
        name = name.rstrip(":").split("@")[0]
        if name.startswith(PREFIX):
            names.append(name)
    return names


def _owned_prefix() -> str:
    """What every name this process makes starts with: it says which pid made it."""
    return PREFIX + _base36(os.getpid(), _PID_DIGITS)


def _owner_gone(name: str) -> bool:
    digits = name[len(PREFIX) : len(PREFIX) + _PID_DIGITS]
    try:
        pid = int(digits, 36)
    except ValueError:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


_NETWORK = re.compile(r"\b(\d+\.\d+\.\d+\.\d+(?:/\d+)?)\b")


def _free_subnet() -> IPv4Network:
    """A 10.a.b.0/24 no interface or route here uses, starting from one the pid picks (so
    that concurrent runs start apart)."""
    text = _ip("-4", "-o", "addr") + _ip("-4", "route", "show", "table", "all")
    used = [ip_network(m, strict=False) for m in _NETWORK.findall(text)]
    used = [net for net in used if net.prefixlen >= 8]  # a default route overlaps all
    rng = random.Random(os.getpid() * 1000 + next(_counter))
    for _ in range(_SUBNET_TRIES):
        candidate = IPv4Network(f"10.{rng.randint(100, 254)}.{rng.randint(0, 255)}.0/24")
        if not any(candidate.overlaps(net) for net in used):
            return candidate
    raise HostsError("no free 10.x.y.0/24 subnet for the chaos hosts' bridge")


def _ip(*args: str) -> str:
    """Runs ``ip`` and returns its output; a failure is a ``HostsError`` quoting the
    command and what ``ip`` said."""
    try:
        done = subprocess.run(
            ["ip", *args], capture_output=True, text=True, timeout=_IP_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise HostsError(f"`ip {' '.join(args)}` could not run: {exc}") from None
    if done.returncode != 0:
        raise HostsError(f"`ip {' '.join(args)}` failed: {done.stderr.strip()}")
    return done.stdout


def _base36(value: int, width: int = 1) -> str:
    digits = ""
    while value or len(digits) < width:
        value, digit = divmod(value, 36)
        digits = "0123456789abcdefghijklmnopqrstuvwxyz"[digit] + digits
    return digits
