"""Listing names by vhost (client/admin.py): the default vhost's lists (GET /api/topics,
/api/consumer-groups, ``hamq topic list``) held every other vhost's ``V%name`` too."""

from __future__ import annotations

from hamq.client.admin import AsyncAdmin

WIRE_NAMES = ["Orders", "v1%Orders", "%RETRY%g", "%RETRY%v1%g", "%%x", "v1%g"]


def test_the_default_vhost_lists_only_its_own_names():
    admin = AsyncAdmin("127.0.0.1:1")  # no request is made: the names are given
    assert admin._in_vhost(WIRE_NAMES) == ["Orders", "%RETRY%g", "%%x"]


def test_another_vhost_lists_its_names_as_its_users_know_them():
    admin = AsyncAdmin("127.0.0.1:1", vhost="v1")
    assert admin._in_vhost(WIRE_NAMES) == ["Orders", "g"]
