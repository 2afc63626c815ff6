"""Each depth change held to account: the pool's rate before it, the rate the plan forecast for
the pool it made, and the rate realized once it settled, in the same regime. Pure: the caller
passes the time and the tokens the pool has completed so far."""

from __future__ import annotations

import itertools
import math
import statistics
from collections import deque

import msgspec

from specroute.planner import Plan
from specroute.wire import Account

__all__ = ["Ledger"]

_KEPT = 20
_BATCHES = 4
"""Sub-spans a rate's noise is read from (batch means)."""


class _Open(msgspec.Struct, kw_only=True):
    server: str
    begun: float
    regime_started: float
    before_tok_s: float
    before_noise: float
    forecast_tok_s: float
    forecast_before_tok_s: float
    done: float | None = None
    cut: float | None = None
    """When a later change began: the end of what this one's rate may be measured over."""


class Ledger:
    """The realized rate from the completed tokens the loop samples, and the accounts of
    the changes: opened when one begins, closed `settle_s + measure_s` after it is done
    (the rate over the last `measure_s`), void when the regime changed meanwhile.

    Each rate is of one pool: a change's "before" is measured since the previous change was
    done, and its "after" until the next one began (a server away for the next change is not
    this change's doing). Where that leaves less than half the window, the rate is not taken:
    on a multi-server move the first change's account would otherwise measure the second's
    restart, and its shortfall would raise the bar for no fault of the forecast.

    "Before" spans as much as "after" may (`measure_s`), within the regime the change was made
    in and since its load last steadied (`Regime.steady_since`): on costly-drafts' ramp a step
    from 64 users to 32 stayed within one regime's band, the rate before a change at 32 took in
    the 64-user step's last replies (3499 tok/s where the pool ran 2947), and the change's
    realized gain of +3.8% was read as -12.6% and raised the bar (`docs/policy-evaluation.md`,
    item 29). Read over the last window alone, "before" came from a reply or two at a few
    users: on the seed's night-burst two users' long replies put a pool the model valued at 465
    tok/s at 489, the change's realized gain fell 12 points under its forecast for that alone,
    and the bar rose by as much ("The rate before a change").

    Each rate comes with its noise (`noise`): tokens are counted per reply, and at a few users
    a span holds a few dozen replies whose count moves by chance. The realized gain's standard
    error goes with it into the account, and the planner holds a forecast to a miss beyond
    it, not to a few replies' chance (`Planner.account`)."""

    def __init__(self, *, window_s: float = 60.0, settle_s: float = 30.0, measure_s: float = 120.0):
        self.window_s = window_s
        self.settle_s = settle_s
        self.measure_s = measure_s
        self._samples: deque[tuple[float, float]] = deque()
        self._open: dict[str, _Open] = {}
        self._away: dict[str, float] = {}
        """When each change under way began."""
        self._calm_since = -math.inf
        """When the latest change was done: the pool has been one pool since."""
        self.accounts: list[Account] = []

    def sample(self, now: float, tokens: float) -> None:
        """The pool's completed tokens so far, at `now`."""
        self._samples.append((now, tokens))
        keep = max(self.window_s, self.settle_s + self.measure_s) * 4
        while len(self._samples) > 2 and self._samples[1][0] < now - keep:
            self._samples.popleft()

    def rate(self, start: float, end: float) -> float | None:
        """Tokens per second completed between the samples nearest `start` and `end`; None
        when fewer than half of that span was sampled."""
        inside = [(t, n) for t, n in self._samples if start <= t <= end]
        if len(inside) < 2 or inside[-1][0] - inside[0][0] < (end - start) / 2:
            return None
        (t0, n0), (t1, n1) = inside[0], inside[-1]
        return (n1 - n0) / (t1 - t0)

    def noise(self, start: float, end: float) -> float:
        """The relative standard error of `rate(start, end)`, from the rates of `_BATCHES`
        equal sub-spans (batch means: no model of how replies arrive). 0 where the span was
        sampled too sparsely to cut, or completed nothing."""
        inside = [(t, n) for t, n in self._samples if start <= t <= end]
        if len(inside) < 2 * _BATCHES:
            return 0.0
        t0, t1 = inside[0][0], inside[-1][0]
        step = (t1 - t0) / _BATCHES
        cuts = [min(inside, key=lambda s: abs(s[0] - (t0 + i * step))) for i in range(_BATCHES + 1)]
        rates = [(b[1] - a[1]) / (b[0] - a[0]) for a, b in itertools.pairwise(cuts) if b[0] > a[0]]
        mean = (inside[-1][1] - inside[0][1]) / (t1 - t0)
        if len(rates) < _BATCHES or mean <= 0:
            return 0.0
        return statistics.stdev(rates) / math.sqrt(len(rates)) / mean

    def begin(self, now: float, server: str, plan: Plan) -> None:
        """A change of `plan` begins on `server`: the rate now and the forecast it is held to.
        Changes begun earlier are measured up to now (`cut`); none is opened while another
        change is under way, nor when the pool has been as it is, in this regime, for less than
        half a window."""
        for change in self._open.values():
            if change.begun < now and change.cut is None:
                change.cut = now
        busy = any(began < now for began in self._away.values())
        self._away[server] = now
        start = max(now - self.measure_s, self._calm_since, plan.regime.started_at,
                    plan.regime.steady_since)  # fmt: skip
        before = None if busy or now - start < self.window_s / 2 else self.rate(start, now)
        if before is None or plan.expected is None:
            return
        self._open[server] = _Open(server=server, begun=now, before_tok_s=before,
                                   before_noise=self.noise(start, now),
                                   regime_started=plan.regime.started_at,
                                   forecast_tok_s=plan.expected.tok_s,
                                   forecast_before_tok_s=plan.current.tok_s)  # fmt: skip

    def done(self, now: float, server: str, ok: bool) -> None:
        """The change is over: measured from `settle_s` on if it made its pool, else dropped."""
        self._away.pop(server, None)
        self._calm_since = max(self._calm_since, now)
        change = self._open.get(server)
        if change is None:
            return
        if ok:
            change.done = now
        else:
            del self._open[server]

    def close(self, now: float, regime_started: float) -> list[Account]:
        """The accounts that close now (measured, or void: the regime changed meanwhile)."""
        closed = []
        for name, change in list(self._open.items()):
            if change.done is None:
                continue
            end = change.done + self.settle_s + self.measure_s
            if regime_started > change.begun:
                closed.append(self._account(change, None, "the regime changed before it settled"))
            elif change.cut is not None and change.cut < end:
                start = change.done + self.settle_s
                if change.cut - start < self.measure_s / 2:
                    note = "another change began before it was measured"
                    closed.append(self._account(change, None, note))
                else:
                    closed.append(self._measured(change, start, change.cut))
            elif now >= end:
                closed.append(self._measured(change, end - self.measure_s, end))
            else:
                continue
            del self._open[name]
        self.accounts = [*self.accounts, *closed][-_KEPT:]
        return closed

    def _measured(self, change: _Open, start: float, end: float) -> Account:
        """The account of `change`, its pool's rate measured over [start, end]."""
        realized = self.rate(start, end)
        noise = self.noise(start, end) if realized else 0.0
        return self._account(change, realized, "" if realized else "no samples", noise)

    @staticmethod
    def _account(change: _Open, realized: float | None, note: str, noise: float = 0.0) -> Account:
        error = gain = spread = None
        if realized:
            error = (change.forecast_tok_s - realized) / realized
        if realized and change.before_tok_s > 0:
            gain = realized / change.before_tok_s - 1
            spread = (1 + gain) * math.hypot(noise, change.before_noise)
        was = change.forecast_before_tok_s
        promised = change.forecast_tok_s / was - 1 if was > 0 else None
        return Account(
            at=change.begun, servers=[change.server], before_tok_s=round(change.before_tok_s, 1),
            forecast_tok_s=round(change.forecast_tok_s, 1),
            realized_tok_s=None if realized is None else round(realized, 1),
            forecast_error=None if error is None else round(error, 4),
            realized_gain=None if gain is None else round(gain, 4),
            realized_gain_noise=None if spread is None else round(spread, 4),
            forecast_gain=None if promised is None else round(promised, 4), note=note,
        )  # fmt: skip
