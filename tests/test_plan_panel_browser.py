"""The dashboard's Depth plan panel in a real headless browser: a plan published as the
launcher's depth loop publishes it shows its verdict and reason, each server's state (one
draining, one falling back) and the history of changes."""

from __future__ import annotations

from pathlib import Path

import httpx
import msgspec
import pytest
from servers import Server, run_server

from specroute.planner import Change, Forecast, Plan, Regime, Setting
from specroute.reconfigure.actuator import Actuator
from specroute.reconfigure.loop import ProxyLink, ReconfigureOptions, Reconfigurer
from specroute.wire import Account, PlanDocument

CHROMIUM = Path("/usr/bin/chromium")
pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(), reason="needs Debian's chromium (make browser installs it)"
)
playwright = pytest.importorskip("playwright.sync_api")

K1, K2, K3 = Setting(steps=1), Setting(steps=2), Setting(steps=3)


async def _no_restart(name: str, setting: Setting) -> str | None:
    return "not in this test"


def _document() -> PlanDocument:
    """What the loop publishes mid-run: a finished change, one draining, one falling back."""
    clock = [0.0]
    act = Actuator("auto", [("steps1", K1, 30.0), ("steps2", K2, 30.0), ("steps3", K3, 30.0)],
                   clock=lambda: clock[0])  # fmt: skip
    regime = Regime(concurrency=2.0, shares={"m:greedy": 1.0}, started_at=0.0, elapsed_s=300.0,
                    expected_remaining_s=1800.0, regimes_seen=0, peak_concurrency=2.0,
                    steady=True)  # fmt: skip
    current = Forecast(settings=("k1", "k2", "k3"), tok_s=781.0, per_request_tok_s=390.0,
                       queued=0, value=781.0, servers=())  # fmt: skip
    moves = [Change(server=n, before=b, after=K3, cost_tokens=0.0)
             for n, b in (("steps1", K1), ("steps2", K2))]  # fmt: skip
    reason = "k1/k2/k3 781 -> k3/k3/k3 971 at 2.0 users"
    plan = Plan(at=0.0, verdict="reconfigure", reason=reason, regime=regime, current=current,
                changes=tuple(moves), start=tuple(moves), bar=0.043)  # fmt: skip
    act.admit(plan)
    act.drained("steps2")
    act.failed("steps2", "steps2 exited with status -9")
    clock[0] = 40.0
    act.ready("steps2")  # fell back
    loop = Reconfigurer(ReconfigureOptions(mode="auto"), ProxyLink("http://127.0.0.1:9", "k"),
                        act, _no_restart, limit=lambda k: 48)  # fmt: skip
    loop.plan = plan
    loop.ledger.accounts = [
        Account(at=-900.0, servers=["steps3"], before_tok_s=461.3, forecast_tok_s=579.4,
                realized_tok_s=532.8, forecast_error=0.0875, realized_gain=0.155,
                realized_gain_noise=0.0843, forecast_gain=0.2559),
        Account(at=-300.0, servers=["steps1"], before_tok_s=700.0, forecast_tok_s=760.0,
                forecast_gain=0.09, note="the regime changed before it settled"),
    ]  # fmt: skip
    return loop.document()


def test_the_panel_shows_the_plan_each_servers_state_and_the_history(emulator: Server) -> None:
    serve = ["serve", "--backend", f"steps1={emulator.url}", "--admin-key", "panel-admin"]
    with run_server(serve) as proxy:
        document = _document()
        answer = httpx.put(proxy.url + "/plan", content=msgspec.json.encode(document),
                           headers={"authorization": "Bearer panel-admin"})  # fmt: skip
        assert answer.status_code == 200
        with playwright.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
            try:
                page = browser.new_page()
                page.goto(proxy.url + "/dashboard")
                # A function, not an expression: polling an expression evals it, which the
                # dashboard's CSP (no unsafe-eval) refuses once it is not true at once.
                page.wait_for_function(
                    "() => document.getElementById('plan-verdict').textContent === 'reconfigure'"
                )
                reason = page.text_content("#plan-reason") or ""
                mode = page.text_content("#plan-mode") or ""
                rows = page.eval_on_selector_all(
                    "#plan-servers tr", "rows => rows.map(r => r.innerText)"
                )
                history = page.text_content("#plan-history") or ""
                accounts = page.eval_on_selector_all(
                    "#plan-accounts tr", "rows => rows.map(r => r.innerText)"
                )
                bar = page.text_content("#plan-bar") or ""
            finally:
                browser.close()
    assert "781 -> k3/k3/k3 971" in reason
    assert mode.startswith("auto")
    states = {row.split("\t")[0]: row for row in rows[1:]}
    assert "draining" in states["steps1"]
    assert "k3" in states["steps1"]  # moving to
    assert "serving" in states["steps3"]
    assert "fell_back" in history
    assert "exited with status -9" in history
    # Each change held to account, the latest first: forecast against realized, the realized
    # gain with its noise; one with no verdict says why.
    assert accounts[1].split("\t")[:6] == ["steps1", "700", "760", "\u2013", "+9.0%", "\u2013"]
    assert "the regime changed before it settled" in accounts[1]
    assert accounts[2].split("\t")[:6] == ["steps3", "461", "579", "533", "+25.6%",
                                           "+15.5% \u00b1 8.4%"]  # fmt: skip
    assert bar == "a change must gain +4.3%"


def test_a_restarting_server_is_shown_moving_with_its_change_not_down(emulator: Server) -> None:
    # `steps2` answers nothing (a server mid-restart); the actuator holds it `restarting`.
    serve = ["serve", "--backend", f"steps1={emulator.url}", "--backend",
             "steps2=http://127.0.0.1:9", "--admin-key", "panel-admin"]  # fmt: skip
    with run_server(serve) as proxy:
        hold = {"state": "restarting", "to": "k3", "reason": "k1/k2 500 -> k1/k3 560"}
        answer = httpx.put(proxy.url + "/pool/backends/steps2/state", json=hold,
                           headers={"authorization": "Bearer panel-admin"})  # fmt: skip
        assert answer.status_code == 200
        with playwright.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
            try:
                page = browser.new_page()
                page.goto(proxy.url + "/dashboard")
                card = "[data-backend='steps2']"
                page.wait_for_function(
                    "() => (document.querySelector(\"[data-backend='steps2']\") || {dataset: {}})"
                    ".dataset.state === 'restarting'"
                )
                sub = page.text_content(card + " .sub") or ""
                dot = page.get_attribute(card + " .dot", "class") or ""
                healthy = page.text_content("[data-backend='steps1'] .sub") or ""
            finally:
                browser.close()
    assert sub.startswith("restarting \u2192 k3 (k1/k2 500 -> k1/k3 560)")
    assert "DOWN" not in sub
    assert dot.split() == ["dot", "moving"]  # not the red `down` dot
    assert healthy.startswith("healthy")
