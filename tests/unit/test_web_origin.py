"""Which requests the API refuses for coming from another site or a DNS-rebinding name
(hamq.web.origin): the rules alone; tests/web/test_console_attacks.py attacks a real server."""

from __future__ import annotations

import socket

import pytest

from hamq.web.origin import refusal

HOST = "127.0.0.1:15672"


@pytest.mark.parametrize(
    "host",
    [
        HOST,
        "localhost:15672",
        "LOCALHOST",
        "console.localhost:1",
        "[::1]:15672",
        "10.1.2.3",
        socket.gethostname(),
        "",
    ],
)
def test_hosts_no_rebinding_page_can_send_are_served(host):
    assert refusal("GET", {"host": host}) is None


@pytest.mark.parametrize("host", ["evil.example:15672", "127.0.0.1.nip.io", "localhost.evil"])
def test_other_names_are_refused_even_for_reads(host):
    reason = refusal("GET", {"host": host})
    assert reason is not None and host in reason


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH"])
def test_writes_from_another_origin_are_refused(method):
    for origin in ("http://127.0.0.1:8000", "http://evil.example", "null"):
        reason = refusal(method, {"host": HOST, "origin": origin})
        assert reason is not None and origin in reason, origin


def test_own_origin_no_origin_and_cross_origin_reads_are_served():
    assert refusal("POST", {"host": HOST, "origin": f"http://{HOST}"}) is None
    assert refusal("DELETE", {"host": HOST}) is None  # curl, scripts
    assert refusal("GET", {"host": HOST, "origin": "http://evil.example"}) is None
