"""The loopback fallback of the chaos hosts, and the checks every kind of hosts shares."""

from __future__ import annotations

import socket

import pytest

from hamq.chaos.hosts import HostsError, LoopbackHosts, Unsupported, make_hosts


def test_loopback_hosts_get_distinct_bindable_addresses_and_run_commands_as_they_are():
    hosts = make_hosts("unit", prefer="loopback")
    assert (hosts.kind, hosts.client_address) == ("loopback", "127.0.0.1")
    a, b = hosts.add("a"), hosts.add("b")
    assert a.address != b.address and a.address.startswith("127.")
    assert hosts.host("b") == b
    for host in (a, b):  # the same port on both: one address per host is the point
        with socket.create_server((host.address, 0)) as server:
            socket.create_connection(server.getsockname(), timeout=2).close()
    assert hosts.command("a", ["hamq", "broker"]) == ["hamq", "broker"]


def test_two_runs_in_one_process_do_not_share_loopback_addresses():
    one, two = LoopbackHosts("one"), LoopbackHosts("two")
    assert one.add("a").address != two.add("a").address


@pytest.mark.parametrize(
    "fault",
    [
        lambda hosts: hosts.partition([{"a"}, {"b"}]),
        lambda hosts: hosts.cut([("a", "b")]),
        lambda hosts: hosts.isolate("a"),
    ],
)
def test_network_faults_on_loopback_say_they_need_namespaces(fault):
    hosts = LoopbackHosts("unit")
    hosts.add("a"), hosts.add("b")
    with pytest.raises(Unsupported, match="needs network namespaces"):
        fault(hosts)
    hosts.heal()  # nothing to undo, and no error
    hosts.close()


@pytest.mark.parametrize("name", ["", "a b", "a/b", "a\n"])
def test_bad_host_names_are_refused(name):
    with pytest.raises(HostsError, match="host name"):
        LoopbackHosts("unit").add(name)


def test_a_host_name_is_taken_once_and_unknown_ones_are_named():
    hosts = LoopbackHosts("unit")
    hosts.add("a")
    with pytest.raises(HostsError, match="exists already"):
        hosts.add("a")
    with pytest.raises(HostsError, match=r"no host 'z'; hosts are \['a'\]"):
        hosts.host("z")


def test_make_hosts_refuses_an_unknown_preference():
    with pytest.raises(HostsError, match="prefer must be"):
        make_hosts("unit", prefer="docker")
