"""The console and API attacked from a browser (real headless Chromium) on one cluster:

- another origin's page (a second local port) cannot change the cluster with the requests a
  browser sends without asking first (a form POST, a ``no-cors`` fetch with ``text/plain``),
  though scripts without an ``Origin`` (curl) still can;
- a DNS-rebinding page (a name that is not this server's) reads nothing;
- names and message contents holding markup are shown as text, never run as HTML.
"""

from __future__ import annotations

import html
import http.server
import json
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from urllib.parse import quote

import pytest
from playwright.sync_api import ConsoleMessage, Error, Page, Route, expect

import hamq
from helpers import free_port, wait_for
from web.test_console import UI_TIMEOUT_MS

TOPIC = "attack.t"
SCRIPTED = "<img src=x onerror=\"window.__xss='{}'\">"  # runs if inserted as HTML
ROUTE_TIMEOUT_S = 30.0
REFRESH_SOON_MS = 3000  # well within the console's 5 s between refreshes
VICTIM = "csrf-victim"  # a consumer group nobody reads with
RESET = {"action": "reset_offset", "topic": TOPIC, "timestamp_ms": 0}


@pytest.fixture(scope="module")
def topic(web_cluster) -> str:
    """A declared, routed topic with one message whose every field holds markup."""
    web_cluster.mc.admin("declare-topic", TOPIC)

    def routed() -> bool:
        answer = web_cluster.request("GET", f"api/topics/{TOPIC}")
        return answer.status == 200 and bool(answer.body["queues"])

    wait_for(routed, ROUTE_TIMEOUT_S, f"{TOPIC} placed and routed")
    return TOPIC


@pytest.fixture(scope="module")
def page(web_cluster, topic, browser) -> Iterator[Page]:
    page = browser.new_page()
    yield page
    page.close()


@dataclass
class OtherOrigin:
    """Another origin than the console's (a second local port): ``url`` serves ``pages``."""

    url: str
    pages: dict[str, str] = field(default_factory=dict)


@pytest.fixture(scope="module")
def other_origin() -> Iterator[OtherOrigin]:
    pages: dict[str, str] = {}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = pages.get(self.path, "").encode()
            self.send_response(200)
            self.send_header("content-type", "text/html")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield OtherOrigin(f"http://127.0.0.1:{server.server_port}/", pages)
    finally:
        server.shutdown()
        server.server_close()


def test_another_origin_cannot_act_without_a_preflight(web_cluster, page, other_origin):
    """A form (text/plain: the JSON split so that its "=" lands in a string) asks for a
    queue sync; a no-cors fetch resets a consumer group's offsets, which would create them."""
    sync = f"{web_cluster.url}api/queues/%2f/{TOPIC}/actions"
    name, value = '{"action": "sync", "pad": "', '"}'
    other_origin.pages["/form"] = (
        f'<form method="post" enctype="text/plain" action="{html.escape(sync)}">'
        f'<input name="{html.escape(name)}" value="{html.escape(value)}"></form>'
        "<script>document.forms[0].submit()</script>"
    )
    reset = f"{web_cluster.url}api/consumer-groups/{VICTIM}/actions"
    other_origin.pages["/fetch"] = (
        f"<script>fetch({json.dumps(reset)}, {{method: 'POST', mode: 'no-cors', "
        f"headers: {{'content-type': 'text/plain'}}, body: {json.dumps(json.dumps(RESET))}}})"
        "</script>"
    )
    for attack, action in (("form", sync), ("fetch", reset)):
        with page.expect_response(lambda r, url=action: r.url == url) as sent:
            page.goto(other_origin.url + attack)
        assert sent.value.status == 403, (attack, sent.value.status, sent.value.text())
    assert web_cluster.request("GET", f"api/consumer-groups/{VICTIM}").status == 404
    # what the browser was refused, curl (no Origin) and the console (its own origin) do
    path = f"api/consumer-groups/{VICTIM}/actions"
    assert web_cluster.request("POST", path, raw=json.dumps(RESET).encode()).status == 200
    own = {"origin": web_cluster.url.rstrip("/")}
    assert web_cluster.request("POST", path, RESET, headers=own).status == 200


def test_a_rebinding_host_reads_nothing(web_cluster):
    port = web_cluster.url.rstrip("/").rsplit(":", 1)[1]
    refused = web_cluster.request("GET", "api/overview", headers={"host": f"evil.example:{port}"})
    assert refused.status == 403 and refused.body["field"] is None, refused
    assert "evil.example" in refused.body["reason"]
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}"):
        assert web_cluster.request("GET", "api/vhosts", headers={"host": host}).status == 200


def test_markup_in_names_and_messages_is_text(web_cluster, page, topic):
    policy = SCRIPTED.format("policy")
    put = web_cluster.request(
        "PUT",
        f"api/policies/%2f/{quote(policy, safe='')}",
        {"pattern": "^nothing-matches$", "definition": {"ha-mode": "all"}},
    )
    assert put.status == 201, put
    properties = {SCRIPTED.format("key"): SCRIPTED.format("value")}
    with hamq.Producer(web_cluster.namesrv) as producer:
        sent = producer.send(
            hamq.Message(
                TOPIC,
                b"</script>" + SCRIPTED.format("body").encode(),
                keys="k\"'><svg/onload=window.__xss=1>",
                tags=SCRIPTED.format("tag"),
                properties=properties,
            )
        )
    try:
        for path, shown in (
            ("policies", policy),
            (f"messages?topic={TOPIC}&msg_id={sent.msg_id}", SCRIPTED.format("body")),
            (f"messages?topic={TOPIC}&msg_id={sent.msg_id}", SCRIPTED.format("value")),
        ):
            page.goto(web_cluster.url + path)
            page.wait_for_selector("#status.ok", timeout=UI_TIMEOUT_MS)
            page.get_by_text(shown).first.wait_for(timeout=UI_TIMEOUT_MS)
            assert page.evaluate("window.__xss") is None, path
            assert page.locator("#page img, #page svg").count() == 0, path
    finally:
        deleted = web_cluster.request("DELETE", f"api/policies/%2f/{quote(policy, safe='')}")
        assert deleted.status == 204, deleted


def _policy(web_cluster, name: str) -> None:
    put = web_cluster.request(
        "PUT", f"api/policies/%2f/{name}", {"pattern": "^none$", "definition": {"ha-mode": "all"}}
    )
    assert put.status == 201, put


def test_policy_form_under_refreshes_and_other_clients(web_cluster, page):
    page.goto(web_cluster.url + "policies")
    page.wait_for_selector("#status.ok", timeout=UI_TIMEOUT_MS)
    # no name: said at the name, not as the "Method Not Allowed" of PUT /api/policies/%2F/
    page.fill("#policy-pattern", "^x")
    page.click("#policy-submit")
    expect(page.locator('[data-error-for="name"]')).to_contain_text("name")
    expect(page.locator('.policy-form > [data-error-for=""]')).to_be_empty()

    # a Delete asked once stays asked across the page's refresh every few seconds
    _policy(web_cluster, "armed")
    row = page.locator('tr[data-policy="//armed"]')
    row.get_by_role("button", name="Delete").click(timeout=UI_TIMEOUT_MS)
    page.click("#pause")  # pause and resume: a refresh now, within the 4 s the question stands
    page.click("#pause")
    expect(page.locator("#status")).to_have_text(re.compile("^updated"), timeout=UI_TIMEOUT_MS)
    row.get_by_role("button", name="Really delete?").click()
    expect(row).to_have_count(0, timeout=UI_TIMEOUT_MS)
    assert web_cluster.request("GET", "api/policies/%2f/armed").status == 404

    # deleted meanwhile by another client: the console says so, and the message stays
    _policy(web_cluster, "gone")
    row = page.locator('tr[data-policy="//gone"]')
    row.get_by_role("button", name="Delete").click(timeout=UI_TIMEOUT_MS)
    assert web_cluster.request("DELETE", "api/policies/%2f/gone").status == 204
    row.get_by_role("button", name="Really delete?").click()
    notice = page.locator("#policies-notice")
    expect(notice).to_contain_text("gone", timeout=UI_TIMEOUT_MS)
    expect(notice).to_contain_text("no longer exists")
    expect(row).to_have_count(0, timeout=UI_TIMEOUT_MS)
    expect(notice).to_contain_text("no longer exists")


def test_another_origin_cannot_frame_the_console(web_cluster, page, other_origin):
    """A framed console would let a page trick two clicks onto "Delete" / "Really delete?"."""
    other_origin.pages["/frame"] = f'<iframe src="{web_cluster.url}policies"></iframe>'
    with page.expect_response(lambda r: r.url == f"{web_cluster.url}policies") as framed:
        page.goto(other_origin.url + "frame")
    headers = framed.value.headers
    assert "frame-ancestors 'none'" in headers.get("content-security-policy", ""), headers
    page.wait_for_timeout(500)  # the frame would have its document by now
    child = page.frames[1]
    assert not child.url.startswith(web_cluster.url), child.url


def test_an_action_during_a_slow_refresh_is_shown_at_once(web_cluster, page):
    """A refresh asked for while one is reading (after a delete) runs when that one ends,
    instead of leaving the deleted policy listed, with its Delete, until the next round."""
    _policy(web_cluster, "slow")
    page.goto(web_cluster.url + "policies")
    row = page.locator('tr[data-policy="//slow"]')
    row.wait_for(timeout=UI_TIMEOUT_MS)
    held: list[Route] = []
    page.route("**/api/policies", lambda route: route.fallback() if held else held.append(route))
    page.click("#pause")  # pause and resume: a refresh now, whose read is held
    page.click("#pause")
    wait_for(lambda: bool(page.wait_for_timeout(50) or held), 10, "the refresh's read held")
    stale = held[0].fetch()  # the list as it was, with "slow"
    row.get_by_role("button", name="Delete").click()
    row.get_by_role("button", name="Really delete?").click()
    wait_for(lambda: web_cluster.request("GET", "api/policies/%2f/slow").status == 404, 10, "gone")
    held[0].fulfill(response=stale)
    expect(row).to_have_count(0, timeout=REFRESH_SOON_MS)


def test_the_api_docs_run_only_this_origins_files(web_cluster, page):
    """/api/docs is Swagger UI from the vendored copy (FastAPI's default loads it from a
    CDN into this origin): with every other origin unreachable, as offline, it lists every
    route with no console error, under a CSP that runs only this origin's scripts."""
    foreign: list[str] = []
    errors: list[str] = []

    def only_this_origin(route: Route) -> None:
        if route.request.url.startswith(web_cluster.url):
            route.fallback()
        else:
            foreign.append(route.request.url)
            route.abort()

    def console_error(message: ConsoleMessage) -> None:
        if message.type == "error":
            errors.append(message.text)

    def page_error(error: Error) -> None:
        errors.append(str(error))

    page.route("**/*", only_this_origin)
    page.on("console", console_error)
    page.on("pageerror", page_error)
    try:
        with page.expect_response(f"{web_cluster.url}api/docs") as served:
            page.goto(web_cluster.url + "api/docs")
        csp = served.value.headers.get("content-security-policy", "")
        assert "default-src 'self'" in csp and "frame-ancestors 'none'" in csp, csp
        script_src = next(d for d in csp.split(";") if d.strip().startswith("script-src"))
        assert "unsafe-inline" not in script_src and "http" not in script_src, csp
        paths = web_cluster.get("api/openapi.json")["paths"]
        listed = page.locator(".opblock-summary-path")
        expect(listed.first).to_be_visible(timeout=UI_TIMEOUT_MS)
        shown = {p.get_attribute("data-path") for p in listed.all()}
        assert shown == set(paths), set(paths) ^ shown
    finally:
        page.unroute("**/*", only_this_origin)
        page.remove_listener("console", console_error)
        page.remove_listener("pageerror", page_error)
    assert foreign == [], foreign
    assert errors == [], errors
