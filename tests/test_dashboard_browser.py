"""The dashboard in a real headless browser (Debian's chromium, driven by Playwright) against a
running `specroute demo`: live numbers appear and change under load, the policy is switched from
the page with the admin key, and a screenshot is saved (`SPECROUTE_DASHBOARD_SCREENSHOT` names
the file; `make dashboard-screenshot` writes docs/img/dashboard.png)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from servers import bound_socket

CHROMIUM = Path("/usr/bin/chromium")
pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(), reason="needs Debian's chromium (make browser installs it)"
)
playwright = pytest.importorskip("playwright.sync_api")

ADMIN_KEY = "dashboard-admin"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
NUMBERS = """(metric) => [...document.querySelectorAll(`[data-metric="${metric}"]`)]
    .map((e) => parseFloat(e.firstChild.textContent))"""


@pytest.fixture(scope="module")
def demo() -> Iterator[str]:
    """`specroute demo` serving until interrupted, with an admin key from the environment."""
    env = {**os.environ, "SPECROUTE_ADMIN_KEY": ADMIN_KEY, "PYTHONUNBUFFERED": "1"}
    with bound_socket() as sock:  # the proxy's, held from here on
        port, fd = sock.getsockname()[1], sock.fileno()
        process = subprocess.Popen(
            [sys.executable, "-m", "specroute", "demo", "--policy", "least_loaded",
             "--port", str(port), "--fd", str(fd)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            pass_fds=[fd],
        )  # fmt: skip
    try:
        assert process.stdout is not None
        for line in process.stdout:  # the demo prints this once its own sample traffic is done
            if line.startswith("Serving until Ctrl-C"):
                break
        else:
            raise RuntimeError(f"the demo exited with {process.wait()}")
        yield f"http://127.0.0.1:{port}"
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


class Load:
    """Streamed chat completions from a few threads, half greedy and half sampled, until
    stopped (at most `limit_s` seconds, so a failed test cannot leave it running)."""

    def __init__(self, url: str, workers: int = 8, limit_s: float = 90.0) -> None:
        self.url, self.stop, self.deadline = url, threading.Event(), time.monotonic() + limit_s
        model = httpx.get(url + "/v1/models", timeout=10).json()["data"][0]["id"]
        self.threads = [
            threading.Thread(target=self._run, args=(model, i), daemon=True) for i in range(workers)
        ]

    def _run(self, model: str, i: int) -> None:
        body = {
            "model": model,
            "messages": [{"role": "user", "content": "Write a short function."}],
            "max_tokens": 48,
            "stream": True,
            "temperature": 0.0 if i % 2 else 1.0,
        }
        with httpx.Client(timeout=60) as client:
            while not self.stop.is_set() and time.monotonic() < self.deadline:
                with client.stream("POST", self.url + "/v1/chat/completions", json=body) as r:
                    r.read()

    def __enter__(self) -> Load:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=60)


def test_dashboard_shows_live_numbers_that_change_under_load(demo: str, tmp_path: Path) -> None:
    wanted = os.environ.get("SPECROUTE_DASHBOARD_SCREENSHOT")
    shot = Path(wanted or tmp_path / "dashboard.png")
    # Long enough for the charts to show the switch; longer for the README's picture.
    hold_ms = 30_000 if wanted else 8_000
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(demo + "/dashboard")
            page.wait_for_selector("#status.live")
            page.wait_for_function("() => document.querySelectorAll('[data-backend]').length === 3")
            badges = page.eval_on_selector_all(
                ".card h3 .badge", "els => els.map(e => e.textContent)"
            )
            assert badges == ["k=1", "k=2", "k=3"]
            assert page.text_content("#policy-name") == "least_loaded"
            # No planner in the demo: the panel says so once, with what runs one.
            off = "() => document.getElementById('plan-mode').textContent === 'off'"
            page.wait_for_function(off)
            assert "launch --reconfigure" in (page.text_content("#plan-verdict") or "")
            with Load(demo):
                # Tokens flow and requests are in flight on the page, not only in the API.
                page.wait_for_function(
                    f"""() => {{ const n = ({NUMBERS});
                        return n("tok_s").some((v) => v > 0) && n("load").some((v) => v > 0); }}"""
                )
                before = page.evaluate(f"({NUMBERS})('tok_s')")
                seq = int(page.get_attribute("body", "data-seq") or 0)
                page.wait_for_function(
                    f"""([before, seq]) => Number(document.body.dataset.seq) >= seq + 2 &&
                        JSON.stringify(({NUMBERS})("tok_s")) !== JSON.stringify(before)""",
                    arg=[before, seq],
                )
                assert page.text_content("#share-legend b")  # a share per depth is shown
                _share_axis_matches_its_title(page, "5 min", 300)
                _relayed_and_server_rates_are_explained(page)
                _decisions_are_a_bounded_list(page)
                _each_lane_shows_its_requests_and_speeds(page)
                _classes_show_what_the_planner_reads(page)
                _switch_policy_from_the_page(page, demo)
                page.click("button[data-window='60']")
                _share_axis_matches_its_title(page, "1 min", 60)
                page.wait_for_timeout(hold_ms)
                page.screenshot(path=str(shot), full_page=True)
            assert not errors
        finally:
            browser.close()
    assert shot.stat().st_size > 20_000


def _share_axis_matches_its_title(page: playwright.Page, window: str, seconds: int) -> None:
    """The chart's title names the window its axis spans; the 10 s is each point's smoothing."""
    title = page.text_content("#share-title") or ""
    assert title.endswith(f"last {window}"), title
    assert page.text_content("#share-from") == f"\u2212{window}"
    assert page.get_attribute("#share-chart", "data-window-s") == str(seconds)
    assert "trailing 10 s" in (page.text_content("#share") or "")
    assert "trailing 10 s" in (page.text_content("#share-legend") or "")


def _relayed_and_server_rates_are_explained(page: playwright.Page) -> None:
    """What "230 tok/s · server 294" means: on the page and in each number's tooltip."""
    legend = page.text_content("#backends-legend") or ""
    assert "relayed" in legend
    assert "gen_throughput" in legend
    page.wait_for_function(
        "() => [...document.querySelectorAll('[data-metric=tok_s] small')]"
        ".some((e) => e.textContent.includes('server'))"
    )
    for number in page.query_selector_all("[data-metric=tok_s]"):
        small, tip = number.text_content() or "", number.get_attribute("title") or ""
        assert "tok/s relayed" in small
        assert "this proxy relayed" in tip
        assert ("server" in small) == ("gen_throughput" in tip)


ROWS = "document.querySelectorAll('#decision-list tbody tr').length"


def _decisions_are_a_bounded_list(page: playwright.Page) -> None:
    """The newest 20 first, more on request, in a box that scrolls: the table below stays put."""
    page.wait_for_selector("#decisions-more:not([hidden])")
    assert page.evaluate(ROWS) == 20
    ages = page.eval_on_selector_all(
        "#decision-list tbody tr td:first-child", "els => els.map(e => parseFloat(e.textContent))"
    )
    assert ages == sorted(ages)
    classes_at = page.evaluate("document.querySelector('#classes').offsetTop")
    page.click("#decisions-more")
    assert page.evaluate(ROWS) > 20
    assert "last 20" in (page.text_content("#decisions-more") or "")
    box = page.eval_on_selector("#decision-list", "e => [e.clientHeight, e.scrollHeight]")
    assert box[0] < box[1]  # it scrolls instead of growing
    assert page.evaluate("document.querySelector('#classes').offsetTop") == classes_at
    page.click("#decisions-more")
    assert page.evaluate(ROWS) == 20


def _switch_policy_from_the_page(page: playwright.Page, url: str) -> None:
    page.select_option("#policy-select", "throughput")
    page.fill("#admin-key", "not-the-key")
    page.click("#switch-button")
    page.wait_for_selector("#switch-msg.err")
    assert httpx.get(url + "/policy", timeout=10).json()["policy"] == "least_loaded"
    page.fill("#admin-key", ADMIN_KEY)
    page.click("#switch-button")
    page.wait_for_selector("#switch-msg.ok")
    assert "throughput" in (page.text_content("#switch-msg") or "")
    assert httpx.get(url + "/policy", timeout=10).json()["policy"] == "throughput"
    page.wait_for_function(
        "() => document.querySelector('#policy-name').textContent === 'throughput'"
    )


def _each_lane_shows_its_requests_and_speeds(page: playwright.Page) -> None:
    """The demo's traffic names no lane: every request is batch, none interactive."""
    page.wait_for_function(
        """() => { const n = (lane) => parseFloat(document.querySelector(
              `[data-lane=${lane}] [data-metric=lane_requests]`)?.textContent);
            return n("batch") > 0 && n("interactive") === 0; }"""
    )
    speeds = page.text_content("[data-lane=batch] td:nth-child(6)")
    assert speeds is not None
    assert "\u2013" not in speeds.split("/")[0]  # a median speed is shown


def test_the_share_chart_leaves_idle_stretches_blank(demo: str) -> None:
    """Traffic, a minute idle, traffic again: each depth's area is two pieces, not one drawn
    across the idle minute."""

    def samples(route: playwright.Route) -> None:
        real = route.fetch().json()
        template = real["samples"][-1]
        busy = {"1": 2, "3": 1}
        series = [
            {**template, "t": float(t), "depths": busy if t < 20 or t >= 80 else {}}
            for t in range(0, 100)
        ]
        route.fulfill(json={**real, "seq": 10_000, "samples": series})

    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.route("**/dashboard/data*", samples)
            page.goto(demo + "/dashboard")
            page.wait_for_selector("#status.live")
            page.wait_for_function(
                "() => document.querySelectorAll('#share-chart polygon').length > 0"
            )
            pieces = page.eval_on_selector_all(
                "#share-chart polygon", "els => els.map((e) => e.dataset.depth)"
            )
        finally:
            browser.close()
    assert len(pieces) == 4  # two depths, two stretches of traffic each
    assert sorted(pieces) == ["1", "1", "3", "3"]


def _classes_show_what_the_planner_reads(page: playwright.Page) -> None:
    """Each class's first-token wait and the pause other requests' prefills cost it, as
    `/pool` has them: the demo streams, several requests share each server."""
    page.wait_for_function(
        """() => ["first_token_s", "prefill_pause_s"].every((m) =>
            [...document.querySelectorAll(`#class-table [data-metric=${m}]`)]
              .some((e) => !isNaN(parseFloat(e.textContent))))"""
    )
    heads = page.eval_on_selector_all("#class-table th", "els => els.map(e => e.textContent)")
    assert "first token (s)" in heads
    assert "prefill pause (s)" in heads
