"""The whole management API fuzzed from its own OpenAPI schema (schemathesis) against a
real cluster: whatever a caller sends, valid or not, the answer is never a 5xx and always
matches the schema the API publishes. Destructive routes run too, on this module's own
throwaway cluster; their answers to bad input must still be 4xx.

The operations are collected from the schema the app builds (the one it serves at
``/api/openapi.json``: ``test_the_served_schema_is_the_one_fuzzed`` checks that), so pytest
lists one test per operation before any cluster starts."""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance

from hamq.web.access import ClusterAccess
from hamq.web.app import create_app

# Few examples per operation: about 30 operations, the whole run well under a minute.
EXAMPLES_PER_OPERATION = 6
# Nothing is reached while the schema is built; only its routes are read.
OPENAPI = create_app(ClusterAccess(["127.0.0.1:1"])).openapi()
schema = schemathesis.openapi.from_dict(OPENAPI)


@pytest.fixture(scope="module")
def web_cluster(own_web_cluster):
    """Not the session's shared cluster. Its writes to "/" could be sent to a throwaway
    vhost, but what it creates (topics, vhosts, policies, groups of any name) would still be
    listed by every other module's routes and console pages, whose answers would then
    depend on whether the fuzzer ran first."""
    return own_web_cluster


def test_the_served_schema_is_the_one_fuzzed(web_cluster):
    assert web_cluster.get("api/openapi.json") == OPENAPI


@schema.parametrize()
@settings(
    max_examples=EXAMPLES_PER_OPERATION,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)
def test_no_server_error_and_answers_match_the_schema(case, web_cluster):
    case.call_and_validate(
        base_url=web_cluster.url.rstrip("/"),
        checks=[not_a_server_error, response_schema_conformance],
    )
