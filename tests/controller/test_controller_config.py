"""Controller settings name themselves in errors (they share the peer list's form with
DLedger's, not its key)."""

from __future__ import annotations

import re

import pytest

from hamq.config import ControllerConfig, NamesrvConfig
from hamq.errors import ConfigError


@pytest.mark.parametrize("cls", [ControllerConfig, NamesrvConfig])
@pytest.mark.parametrize(
    ("peers", "message"),
    [
        (("x@127.0.0.1:9878",), re.escape("controller_peers = ['x@127.0.0.1:9878']: entry")),
        (
            ("1@127.0.0.1:9878", "1@127.0.0.1:9879"),
            "controller_peers = .*member id 1 is listed twice",
        ),
        (("1@127.0.0.1",), "controller_peers"),
    ],
)
def test_a_bad_peer_list_names_controller_peers(cls, peers, message):
    with pytest.raises(ConfigError, match=message):
        cls(controller_peers=peers)


def test_self_id_must_be_a_peer():
    with pytest.raises(ConfigError, match="controller_self_id = 3: must be one of"):
        ControllerConfig(controller_peers=("1@127.0.0.1:9878",), controller_self_id=3)
