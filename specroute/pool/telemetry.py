"""Outcomes into estimates: per-class acceptance, length, first-token wait and prefill pause,
per-backend iteration time and quiet times (before a stream's first token and between its
chunks, for its stall limits).

`Telemetry.observe` picks the most exact acceptance source an outcome has (vLLM's per-request
`metrics.speculative_decoding`, SGLang's `sglext.spec_tokens_details`, else tokens per stream
chunk, else the backend's scraped accept length) and times the gaps between chunks against the
backend's mean batch during the request: their mean for the iteration fit the router reads,
their median for the decode alone, the difference for the other requests' prefills.
`Telemetry.classes()` is what policies see, rebuilt only after something new was learned.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import structlog

from specroute.policies import ClassEstimate, Outcome
from specroute.pool.estimators import (
    AcceptanceEstimator,
    ClassLengths,
    DurationHistogram,
    FirstTokenWaits,
    IterationTimeModel,
    PrefillPauses,
)
from specroute.speculation import PRIOR_ALPHA

__all__ = [
    "IterationCurve",
    "IterationPrior",
    "IterationSample",
    "StreamTimes",
    "Telemetry",
    "accept_sample",
    "iteration_sample",
]

log = structlog.get_logger()

IterationPrior = tuple[float, float]
"""(intercept seconds, seconds per batch token) for one depth, e.g. fitted from a profile."""
IterationCurve = tuple[tuple[float, float], ...]
"""A depth's measured (tokens verified per iteration, seconds) points, sorted by tokens."""

# Verifies one scraped (per-backend, all classes mixed) accept length counts as: a weak hint.
_SCRAPED_WEIGHT = 1.0


def accept_sample(
    outcome: Outcome, scraped: float | None, framing: int = 3
) -> tuple[float, float, str] | None:
    """(accept length, verifies it stands for, source) from the best source the outcome has;
    `framing`: the stream's events that are not decode iterations (`engines.STREAM_FRAMING`)."""
    steps, tokens = outcome.steps, outcome.completion_tokens or 0
    if not steps or outcome.status != 200 or outcome.error is not None:
        return None
    verifies = outcome.verify_count
    if verifies and outcome.accepted_drafts is not None:
        # vLLM's per-request metrics: exact, whatever the last verify's cut or a move.
        return 1.0 + outcome.accepted_drafts / verifies, float(verifies), "request_metrics"
    if verifies and tokens > verifies:
        # The first token comes from prefill, not from a verify pass.
        return (tokens - 1) / verifies, float(verifies), "spec_details"
    if verifies and tokens:
        return tokens / verifies, float(verifies), "spec_details"
    if outcome.stream and tokens > 1 and outcome.chunks > framing:
        # Content chunks after the first: one per decode iteration (role and finish excluded).
        decode_chunks = outcome.chunks - framing
        return (tokens - 1) / decode_chunks, float(decode_chunks), "chunks"
    if scraped is not None and scraped > 0:
        return scraped, _SCRAPED_WEIGHT, "scraped"
    return None


class IterationSample(NamedTuple):
    """What one stream's gaps between chunks say of its server's iterations."""

    batch: float
    """Running requests (the backend's mean batch during the request, at most capacity)."""
    seconds: float
    """Mean iteration: the stream's time between chunks over its iterations."""
    used: int
    """Gaps counted as iterations."""
    decode_s: float
    """The median gap: an iteration with no other request's prefill in it."""

    @property
    def stall_s(self) -> float:
        """The stream's pauses beyond the decode, in all (other requests' prefills)."""
        return max(0.0, self.seconds - self.decode_s) * self.used


def iteration_sample(outcome: Outcome, capacity: int | None) -> IterationSample | None:
    """Running requests and iteration times from the gaps between chunks.

    Gaps far below the median are events that arrived in one read (a finish chunk after the
    last tokens), not iterations; they are left out of the count but not of the time. A gap
    that holds another request's prefill is longer than the rest; the median leaves them out
    while fewer than half do (a request of a hundred iterations beside 30 others)."""
    gaps = outcome.chunk_gaps_s
    if len(gaps) < 3 or outcome.error is not None:
        return None
    ordered = sorted(gaps)  # once: both medians read it (this runs on every reply)
    median = _sorted_median(ordered)
    if median <= 0:
        return None
    used = ordered[bisect.bisect_right(ordered, 0.25 * median) :]
    batch = outcome.mean_in_flight if outcome.mean_in_flight is not None else None
    batch = batch if batch is not None else float(outcome.in_flight_at_start)
    if capacity:
        batch = min(batch, float(capacity))
    mean = sum(gaps) / len(used)
    return IterationSample(max(1.0, batch), mean, len(used), min(mean, _sorted_median(used)))


def _sorted_median(ordered: Sequence[float]) -> float:
    """`statistics.median` of values already sorted."""
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


@dataclass(slots=True)
class StreamTimes:
    """How long one backend's streams stay quiet: from the request to the first chunk, and
    between chunks (a failed stream's gaps too: they are what it showed before it failed)."""

    first: DurationHistogram = field(default_factory=DurationHistogram)
    gaps: DurationHistogram = field(default_factory=DurationHistogram)


class Telemetry:
    """The pool's estimators, fed with every outcome; pure and synchronous."""

    def __init__(
        self,
        *,
        prior_alpha: float = PRIOR_ALPHA,
        half_life: float = 2000.0,
        priors: Mapping[int, IterationPrior] | None = None,
    ) -> None:
        self.acceptance = AcceptanceEstimator(prior_alpha=prior_alpha, half_life=half_life)
        self.lengths = ClassLengths()
        self.first_tokens = FirstTokenWaits()
        self.pauses = PrefillPauses()
        self.iteration: dict[tuple[str, int], IterationTimeModel] = {}
        self.priors: dict[int, IterationPrior] = dict(priors or {})
        self.curves: dict[int, IterationCurve] = {}
        """The prior's measured points per depth: the planner's T(b) at depths no server runs."""
        self.sources: dict[str, int] = {}
        self.streams: dict[str, StreamTimes] = {}
        self._classes: dict[str, ClassEstimate] | None = None

    def stream_times(self, backend: str) -> StreamTimes:
        """The quiet times seen on `backend`'s streams (empty for a new backend)."""
        times = self.streams.get(backend)
        if times is None:
            times = self.streams[backend] = StreamTimes()
        return times

    def iteration_model(self, backend: str, steps: int) -> IterationTimeModel:
        """This backend's fit at this depth, created from the prior for the depth if any (its
        line, and its measured points where it has them)."""
        key = (backend, steps)
        model = self.iteration.get(key)
        if model is None:
            prior, curve = self.priors.get(steps), self.curves.get(steps, ())
            if prior is None:
                model = IterationTimeModel(curve=curve)
            else:
                model = IterationTimeModel(*prior, curve=curve)
            self.iteration[key] = model
        return model

    def seed(
        self,
        priors: Iterable[tuple[int, IterationPrior]],
        curves: Iterable[tuple[int, IterationCurve]] = (),
    ) -> None:
        """Priors per depth (from a bench profile); models already created keep their data."""
        self.priors.update(priors)
        self.curves.update(curves)

    def observe(
        self,
        outcome: Outcome,
        *,
        capacity: int | None,
        scraped: float | None = None,
        acceptance: bool = True,
        framing: int = 3,
    ) -> None:
        """Learn from one outcome; `acceptance=False` for a backend whose depth moves during a
        request (adaptive), where an accept length cannot be tied to one depth; `framing` as
        in `accept_sample`."""
        klass = outcome.workload_class
        if outcome.status == 200 and outcome.error is None and outcome.completion_tokens:
            self.lengths.observe(klass, outcome.completion_tokens)
        sample = accept_sample(outcome, scraped, framing) if acceptance else None
        if sample is not None and outcome.steps:
            length, verifies, source = sample
            self.acceptance.observe(
                klass, steps=outcome.steps, accept_length=length, verifies=verifies
            )
            self.sources[source] = self.sources.get(source, 0) + 1
        if outcome.stream:
            times = self.stream_times(outcome.backend)
            if outcome.ttft_s is not None:
                times.first.add_all((outcome.ttft_s,))
            times.gaps.add_all(outcome.chunk_gaps_s)
        timing = iteration_sample(outcome, capacity)
        if timing is not None and outcome.status == 200:
            if outcome.ttft_s is not None and (capacity is None or timing.batch < capacity):
                # a free slot: no wait in its queue
                self.first_tokens.observe(klass, outcome.ttft_s - timing.decode_s)
            self.pauses.observe(klass, timing.stall_s, timing.batch - 1.0)
        if timing is not None and outcome.steps is not None:
            model = self.iteration_model(outcome.backend, outcome.steps)
            model.observe(
                timing.batch * (outcome.steps + 1), timing.seconds,
                weight=min(1.0, timing.used / 20), stall_s=timing.seconds - timing.decode_s,
            )  # fmt: skip
        self._classes = None

    def classes(self) -> dict[str, ClassEstimate]:
        """Every class seen, as the read-only estimates policies get."""
        if self._classes is None:
            self._classes = {
                name: ClassEstimate(
                    alpha=est.alpha.value,
                    accept_length={k: m.value for k, m in sorted(est.by_steps.items())},
                    samples=est.samples,
                    mean_tokens=self.lengths.get(name),
                    completions=self.lengths.counts.get(name, 0),
                    first_token_s=self.first_tokens.get(name),
                    prefill_pause_s=self.pauses.get(name),
                )
                for name in dict.fromkeys([*self.acceptance.classes, *self.lengths.counts])
                for est in (self.acceptance.get(name),)
            }
        return self._classes
