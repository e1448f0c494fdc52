"""The web console in real headless Chromium (Debian's ``chromium``, driven by Playwright):
every page loads with no console error and no failed request, and a policy added through
the form mirrors a declared topic (the queues and topics pages show it) until it is deleted
through the form.

Screenshots of each page are test artefacts (``console-screens`` under pytest's temporary
directory, printed at the end); with ``HAMQ_UPDATE_SCREENSHOTS=1`` they also replace
``docs/console/*.png``, which docs/CONSOLE.md shows."""

from __future__ import annotations

import os
import re
import shutil
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect

import hamq
from hamq.errors import HamqError
from hamq.web.console import PAGES
from helpers import wait_for

LAPTOP = {"width": 1440, "height": 900}
DOCS_SCREENS = Path(__file__).resolve().parents[2] / "docs" / "console"
UI_TIMEOUT_MS = 20_000  # a page's first refresh (several cluster reads on a loaded machine)
PLACEMENT_TIMEOUT_MS = 40_000  # the controller places the mirrors a new policy asks for

ROUTE_TIMEOUT_S = 30.0  # a declared topic placed on a node and registered

TOPIC = "console.orders"
GROUP = "console-readers"
POLICY = "console-ha"
SENDS = 40
KEY = "order-7"
TRICKLE_PERIOD_S = 0.1
TRICKLE_MAX = 3000


@dataclass
class Traffic:
    """Messages sent and read through the cluster while the pages are looked at, so the
    charts, offsets and lag show something; ``sent`` holds the first send's result."""

    sent: list[hamq.SendResult] = field(default_factory=list)
    consumed: list[bytes] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def keep_sending(self, namesrv: str) -> None:
        """A trickle of sends until the module ends, for the throughput and lag charts."""
        with hamq.Producer(namesrv) as producer:
            for i in range(TRICKLE_MAX):
                if self.stop.wait(TRICKLE_PERIOD_S):
                    return
                try:
                    producer.send(hamq.Message(TOPIC, b"tick %d" % i))
                except HamqError:
                    pass  # the policy moves the topic to its mirrored group meanwhile


@pytest.fixture(scope="module")
def traffic(web_cluster) -> Iterator[Traffic]:
    # before the browser: Playwright's sync API keeps an event loop running in this thread,
    # and the CLI starts its own
    web_cluster.mc.admin("declare-topic", TOPIC)

    def routed() -> bool:
        answer = web_cluster.request("GET", f"api/topics/{TOPIC}")
        return answer.status == 200 and bool(answer.body["queues"])

    wait_for(routed, ROUTE_TIMEOUT_S, f"{TOPIC} placed and routed by the name servers")
    got = Traffic()
    with hamq.Producer(web_cluster.namesrv) as producer:
        for i in range(SENDS):
            msg = hamq.Message(TOPIC, f"order {i}".encode(), keys=f"order-{i}", tags="new")
            got.sent.append(producer.send(msg))
    consumer = hamq.PushConsumer(
        GROUP,
        web_cluster.namesrv,
        consume_from_where="first",
        rebalance_interval_s=1.0,
        persist_offset_interval_s=0.5,
    )
    done = threading.Event()

    def listener(messages):
        got.consumed.extend(m.body for m in messages)
        if len(got.consumed) >= SENDS // 2:
            done.set()
        return hamq.ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    consumer.subscribe(TOPIC, "*")
    consumer.register_message_listener(listener)
    consumer.start()
    trickle = threading.Thread(target=got.keep_sending, args=(web_cluster.namesrv,), daemon=True)
    try:
        wait_for(done.is_set, 30, f"{GROUP} consumed from {TOPIC}")
        trickle.start()
        yield got
    finally:
        got.stop.set()
        if trickle.is_alive():
            trickle.join(10)
        consumer.shutdown()


@pytest.fixture(scope="module")
def screens(tmp_path_factory) -> Iterator[Path]:
    out = tmp_path_factory.mktemp("console-screens")
    yield out
    print(f"\nconsole screenshots: {out}")
    if os.environ.get("HAMQ_UPDATE_SCREENSHOTS") == "1":
        DOCS_SCREENS.mkdir(parents=True, exist_ok=True)
        for png in sorted(out.glob("*.png")):
            shutil.copy(png, DOCS_SCREENS / png.name)


@dataclass
class Console:
    """One browser tab on the console, with every problem the browser reports."""

    page: Page
    base: str
    problems: list[str] = field(default_factory=list)
    visited: set[str] = field(default_factory=set)

    @staticmethod
    def open(browser: Browser, base: str) -> Console:
        page = browser.new_page(viewport=LAPTOP)
        console = Console(page, base.rstrip("/"))
        page.on("console", lambda m: m.type == "error" and console.problems.append(m.text))
        page.on("pageerror", lambda e: console.problems.append(f"page error: {e}"))
        page.on("requestfailed", lambda r: console.problems.append(f"failed: {r.url} {r.failure}"))
        page.on(
            "response",
            lambda r: r.status >= 400 and console.problems.append(f"{r.status} {r.url}"),
        )
        return console

    def go(self, path: str) -> Page:
        """The page at ``path`` once its first refresh read everything it shows."""
        self.page.goto(self.base + path)
        self.visited.add(path.split("?", 1)[0])
        expect(self.page.locator("#status")).to_have_class(
            re.compile(r"\bok\b"), timeout=UI_TIMEOUT_MS
        )
        return self.page

    def shot(self, screens: Path, name: str) -> None:
        self.page.screenshot(path=screens / f"{name}.png", full_page=True)

    def assert_clean(self) -> None:
        assert self.problems == [], self.problems


@pytest.fixture
def console(browser, web_cluster) -> Iterator[Console]:
    console = Console.open(browser, web_cluster.url)
    yield console
    console.page.close()


def queue_row(page: Page):
    return page.locator(f'#queues-table tr[data-queue="//{TOPIC}"]')


def test_every_page_loads_with_its_data(traffic, console, screens, web_cluster):
    first = traffic.sent[0]

    def sampled_traffic() -> bool:
        series = web_cluster.get("api/history?age_s=60")["series"]
        return any(rate > 0 for _, rate in series["publish_rate"][-3:])

    wait_for(sampled_traffic, 20, "the history sampler saw the trickle of sends")
    page = console.go("/")
    expect(page.locator(".total")).not_to_have_count(0)
    expect(page.locator(".chart canvas")).to_have_count(2)
    expect(page.get_by_text("Broker groups")).to_be_visible()

    page = console.go("/topics")
    expect(page.locator(f'#topics-table tr[data-topic="{TOPIC}"]')).to_be_visible()
    page = console.go(f"/topics?topic={TOPIC}")
    expect(page.get_by_text("Queue offsets")).to_be_visible()
    expect(page.get_by_role("link", name="last message").first).to_be_visible()
    console.shot(screens, "topic")

    page = console.go("/queues")
    expect(queue_row(page)).to_be_visible()

    page = console.go("/consumer-groups")
    expect(page.locator("#groups-table")).to_contain_text(GROUP)
    expect(page.get_by_text(f"Group {GROUP}")).to_be_visible()
    console.shot(screens, "consumer-groups")

    page = console.go(f"/messages?topic={TOPIC}&msg_id={first.msg_id}")
    expect(page.locator("#messages-table")).to_contain_text(first.msg_id)
    expect(page.locator("pre.body").first).to_have_text("order 0")
    page.get_by_role("tab", name="Key").click()
    page.locator("#msg-key").fill(KEY)
    page.locator("#message-search").click()
    expect(page.locator("#messages-table")).to_contain_text("order-7")
    console.shot(screens, "messages")

    page = console.go("/policies")
    expect(page.locator("#policy-form")).to_be_visible()
    assert console.visited == set(PAGES)  # every page of the nav bar
    console.assert_clean()


def test_policy_added_applied_and_deleted_through_the_form(traffic, console, screens):
    page = console.go("/policies")
    form = page.locator("#policy-form")
    form.locator("#policy-name").fill(POLICY)
    form.locator("#policy-pattern").fill(r"^console\.")
    form.locator(".kv-value").first.fill("sometimes")  # ha-mode: not a mode
    form.locator("#policy-submit").click()
    error = form.locator(".kv-row .field-error").first
    expect(error).to_contain_text("ha-mode")
    # the API's 400 is the one problem the browser saw, and the form said where it was
    assert len(console.problems) == 2 and all("400" in p for p in console.problems), (
        console.problems
    )
    console.problems.clear()
    console.shot(screens, "policy-error")

    form.locator(".kv-value").first.fill("all")
    form.locator("#policy-submit").click()
    expect(form.get_by_text(f"Saved policy {POLICY}")).to_be_visible()
    row = page.locator(f'#policies-table tr[data-policy="//{POLICY}"]')
    expect(row).to_contain_text("ha-mode: all")
    console.shot(screens, "policies")

    page = console.go("/queues")
    expect(queue_row(page)).to_contain_text(POLICY, timeout=PLACEMENT_TIMEOUT_MS)
    expect(queue_row(page).locator(".chip")).to_have_count(2, timeout=PLACEMENT_TIMEOUT_MS)
    console.shot(screens, "queues")
    page = console.go("/topics")
    expect(page.locator(f'#topics-table tr[data-topic="{TOPIC}"]')).to_contain_text(POLICY)
    console.shot(screens, "topics")

    page = console.go("/policies")
    delete = page.locator(f'#policies-table tr[data-policy="//{POLICY}"]').get_by_role(
        "button", name="Delete"
    )
    delete.click()
    page.get_by_role("button", name="Really delete?").click()
    expect(page.locator(f'#policies-table tr[data-policy="//{POLICY}"]')).to_have_count(0)
    page = console.go("/queues")
    expect(queue_row(page)).not_to_contain_text(POLICY, timeout=UI_TIMEOUT_MS)
    console.go("/")  # last: the charts have the whole module's traffic by now
    console.shot(screens, "overview")
    console.assert_clean()
