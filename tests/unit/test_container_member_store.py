"""``ContainerConfig.member_store``: the store settings a container gives every member it
hosts, each judged by ``BrokerConfig``'s own rules, a bad one named in one line."""

from __future__ import annotations

import pytest

from hamq.broker.container import member_config
from hamq.config import BrokerConfig, ContainerConfig, dump_toml, load_config
from hamq.errors import ConfigError

GOOD = {
    "flush_disk_type": "sync",
    "sync_flush_timeout_ms": 2000,
    "mapped_file_size_commitlog": 256 * 1024,
    "disk_min_free_bytes": 0,
    "disk_free_limit_bytes": 8 * 1024 * 1024,
}


def load(tmp_path, member_store: object) -> ContainerConfig:
    path = tmp_path / "container.toml"
    path.write_text(dump_toml({"member_store": member_store}))
    return load_config(ContainerConfig, path)


def test_a_table_of_store_settings_loads_as_written(tmp_path):
    assert load(tmp_path, GOOD).member_store == GOOD
    assert ContainerConfig().member_store == {}  # none: each member keeps its own


@pytest.mark.parametrize(
    "member_store, message",
    [
        ({"flush_disk_type": "fast"}, "member_store.flush_disk_type = 'fast': allowed values"),
        ({"mapped_file_size_commitlog": 0}, "member_store.mapped_file_size_commitlog = 0: must"),
        ({"disk_min_free_bytes": -1}, "member_store.disk_min_free_bytes = -1: must be >= 0"),
        ({"disk_free_limit_bytes": "1"}, "member_store.disk_free_limit_bytes = '1': must be an"),
        ({"flush_disk_typ": "sync"}, "member_store.flush_disk_typ: unknown key (did you mean"),
        ({"broker_name": "x"}, "member_store.broker_name: unknown key; a container sets only"),
        ("sync", "member_store = 'sync': must be a table of settings"),
    ],
)
def test_a_bad_key_or_value_is_refused_naming_it(tmp_path, member_store, message):
    with pytest.raises(ConfigError) as info:
        load(tmp_path, member_store)
    assert info.value.message.startswith(f"{tmp_path / 'container.toml'}: {message}")
    assert "\n" not in info.value.message


def test_every_member_runs_with_it_over_its_own_settings():
    """As with ``namesrv``: the container's word wins, the rest is the member's own."""
    own = BrokerConfig(flush_disk_type="async", mapped_file_size_commitlog=1 << 20)
    container = ContainerConfig(member_store={"flush_disk_type": "sync"})
    member = member_config(own, "member.toml", container)
    assert (member.flush_disk_type, member.mapped_file_size_commitlog) == ("sync", 1 << 20)
    assert member_config(own, "member.toml", ContainerConfig()) == own
