"""Names in paths, queries and bodies, with the rules the server checks stated in the
OpenAPI schema (a pattern and a maximum length): a client or a fuzzer then knows which
names the server must refuse. The checks (``validate_name``, ``check_topic``,
``check_vhost``, ``check_policy_name``) stay the source of truth, so each pattern here
admits at least what its check admits (tests/web/test_api_attacks.py compares them)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Path, Query
from pydantic import Field
from starlette.convertors import Convertor, register_url_convertor

from hamq.protocol.limits import MAX_NAME_LENGTH, MAX_TOPIC_LENGTH

# validate_name's characters (RocketMQ's topic rule plus '.').
NAME_PATTERN = r"^[A-Za-z0-9%|_.-]+$"
# check_vhost: "/" or a plain name, since a vhost becomes part of wire names.
VHOST_PATTERN = r"^(/|[A-Za-z0-9_.-]{1,64})$"

TopicPath = Annotated[str, Path(pattern=NAME_PATTERN, max_length=MAX_TOPIC_LENGTH)]
NamePath = Annotated[str, Path(pattern=NAME_PATTERN, max_length=MAX_NAME_LENGTH)]
VhostPath = Annotated[str, Path(pattern=VHOST_PATTERN)]
PolicyNamePath = Annotated[str, Path(min_length=1, max_length=MAX_NAME_LENGTH)]
NameQuery = Annotated[str | None, Query(pattern=NAME_PATTERN, max_length=MAX_NAME_LENGTH)]
VhostQuery = Annotated[str, Query(description="The vhost the names are in.", pattern=VHOST_PATTERN)]
TopicField = Annotated[str, Field(pattern=NAME_PATTERN, max_length=MAX_TOPIC_LENGTH)]
NameField = Annotated[str, Field(pattern=NAME_PATTERN, max_length=MAX_NAME_LENGTH)]


class VhostConvertor(Convertor[str]):
    """``{vhost:vhost}``: one path segment, or ``/`` (``%2f``, which the server decodes
    before routing). Only the vhost ``/`` holds a "/" (check_vhost), so in
    ``{vhost:vhost}/{name:path}`` the name is all that follows, and ``//a/b`` is vhost
    ``/`` with name ``a/b`` (``{vhost:path}/{name}`` read it as vhost ``//a``, name ``b``)."""

    regex = "/|[^/]+"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("vhost", VhostConvertor())
