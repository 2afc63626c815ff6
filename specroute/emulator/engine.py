"""The emulated GPU: continuous batching with speculative decoding, in virtual time, no I/O.

`Engine.step()` runs one iteration: admit queued requests up to capacity (their prefill costs
time in this iteration and yields their first token), then one draft-and-verify pass for every
running request, each accepting drafts position by position with its own acceptance. It returns
how long the iteration took and what each request emitted; the server sleeps that long.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from specroute.emulator.adaptive import DEFAULT_ADAPTIVE_CONFIG, AdaptiveConfig, AdaptiveSteps
from specroute.emulator.profiles import Profile
from specroute.speculation import SPECULATIVE_DEFAULT_MAX_RUNNING

__all__ = ["Emission", "Engine", "Iteration", "Req"]


@dataclass(slots=True, eq=False)
class Req:
    """One request inside the engine (SGLang's scheduler calls it `Req`), with the speculative
    statistics SGLang reports."""

    rid: str
    prompt_tokens: int
    max_new_tokens: int
    target_tokens: int
    klass: str
    rates: tuple[float, ...]
    arrival: float
    generated: int = 0
    verify_ct: int = 0
    correct_drafts: int = 0
    proposed_drafts: int = 0
    histogram: list[int] = field(default_factory=list)
    steps_log: list[tuple[int, int]] | None = None
    """(drafted, accepted) per verify, in order; kept only when the engine `log_steps`."""
    first_token_at: float | None = None
    finished_at: float | None = None
    finish_reason: str | None = None

    @property
    def accept_length(self) -> float:
        """SGLang's `spec_accept_length`: completion tokens per verify."""
        return self.generated / self.verify_ct if self.verify_ct else 0.0

    @property
    def accept_rate(self) -> float:
        return self.correct_drafts / self.proposed_drafts if self.proposed_drafts else 0.0


@dataclass(slots=True, frozen=True)
class Emission:
    """Tokens one request produced in one iteration; `finish_reason` set on its last."""

    seq: Req
    tokens: int
    finish_reason: str | None


@dataclass(slots=True, frozen=True)
class Iteration:
    duration: float
    emissions: list[Emission]
    batch_size: int
    steps: int
    prefilled: int
    accepted_drafts: int
    verifies: int
    accepted_per_pos: tuple[int, ...] = ()
    """Verifies whose draft at position i (0-based) was accepted, for each i below `steps`."""


class Engine:
    """Continuous batching over a FIFO queue, one speculative depth (or adaptive depths).

    At most `max_running_requests` run: the smaller of the flag (SGLang's cap) and what memory
    holds at the deepest depth the server can run, as SGLang's scheduler does.
    """

    def __init__(
        self,
        profile: Profile,
        *,
        steps: int,
        max_running_requests: int | None = None,
        seed: int = 0,
        adaptive: bool = False,
        adaptive_config: AdaptiveConfig = DEFAULT_ADAPTIVE_CONFIG,
        schedule: Callable[[int], int] | None = None,
    ) -> None:
        """`schedule`: a depth per batch size at most `steps` (vLLM's dynamic K table)."""
        if steps < 0:
            raise ValueError("steps must be 0 (no speculation) or more")
        self.profile = profile
        self.steps = steps
        self.adaptive = AdaptiveSteps(steps, adaptive_config) if adaptive else None
        self.schedule = schedule
        self.deepest_steps = adaptive_config.max_steps if adaptive else steps
        """The depth memory is sized for: an adaptive server's deepest candidate."""
        self.memory_capacity = profile.capacity(self.deepest_steps)
        cap = max_running_requests
        if cap is None and steps > 0:
            cap = SPECULATIVE_DEFAULT_MAX_RUNNING
        memory = self.memory_capacity
        self.max_running_requests = memory if cap is None else min(cap, memory)
        self.clock = 0.0
        self.waiting: deque[Req] = deque()
        self.running: list[Req] = []
        self._by_rid: dict[str, Req] = {}
        self._rng = random.Random(seed)
        self.log_steps = False
        """Keep each request's `steps_log` (vLLM's detailed per-request metrics)."""

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.running

    @property
    def active_steps(self) -> int:
        """The depth the next iteration uses (adaptive: its batch's tier decides)."""
        if self.schedule is not None:
            return self.schedule(len(self.running))
        return self.adaptive.steps_for(len(self.running)) if self.adaptive else self.steps

    def submit(
        self,
        rid: str,
        *,
        prompt_tokens: int,
        max_new_tokens: int,
        klass: str,
        ignore_eos: bool,
        stop_at: int | None = None,
    ) -> Req:
        """Queue a request; it runs once a slot under `max_running_requests` frees up. It ends
        at EOS (a drawn length) unless `ignore_eos`, at `stop_at` tokens (a stop string), or at
        `max_new_tokens` (0: right after its prefill, with no token, as SGLang)."""
        if rid in self._by_rid:
            raise ValueError(f"duplicate request id {rid!r}")
        max_new_tokens = max(0, max_new_tokens)
        target = max_new_tokens if ignore_eos else min(max_new_tokens, self._draw_length())
        if stop_at is not None:
            target = min(target, stop_at)
        seq = Req(
            rid=rid,
            prompt_tokens=prompt_tokens,
            max_new_tokens=max_new_tokens,
            target_tokens=target,
            klass=klass,
            rates=self._draw_rates(klass),
            arrival=self.clock,
            steps_log=[] if self.log_steps else None,
        )
        self.waiting.append(seq)
        self._by_rid[rid] = seq
        return seq

    def abort(self, rid: str) -> Req | None:
        """Remove a request wherever it is; it leaves the batch before the next iteration."""
        seq = self._by_rid.pop(rid, None)
        if seq is None:
            return None
        if seq in self.running:
            self.running.remove(seq)
        else:
            self.waiting.remove(seq)
        seq.finish_reason = "abort"
        seq.finished_at = self.clock
        return seq

    def step(self) -> Iteration | None:
        """Run one iteration; None when there is nothing to do."""
        if self.idle:
            return None
        steps = self.active_steps
        decoding = list(self.running)
        joined = self._admit()
        duration = self.profile.iteration_time(len(decoding), steps)
        if joined:
            duration += self.profile.prefill_time(sum(s.prompt_tokens for s in joined))
        self.clock += duration
        emissions: list[Emission] = []
        accepted_total = 0
        per_pos = [0] * steps
        for seq in joined:
            seq.first_token_at = self.clock
            emissions.append(self._emit(seq, 1))
        for seq in decoding:
            accepted = self._draft_and_verify(seq, steps)
            accepted_total += accepted
            for position in range(accepted):
                per_pos[position] += 1
            emissions.append(self._emit(seq, accepted + 1))
        if self.adaptive and decoding:
            self.adaptive.observe(len(decoding), accepted_total / len(decoding))
        self.running = [s for s in self.running if s.finish_reason is None]
        return Iteration(
            duration=duration,
            emissions=emissions,
            batch_size=len(decoding),
            steps=steps,
            prefilled=len(joined),
            accepted_drafts=accepted_total,
            verifies=len(decoding) if steps > 0 else 0,
            accepted_per_pos=tuple(per_pos),
        )

    def _admit(self) -> list[Req]:
        joined: list[Req] = []
        while self.waiting and len(self.running) < self.max_running_requests:
            seq = self.waiting.popleft()
            self.running.append(seq)
            joined.append(seq)
        return joined

    def _draft_and_verify(self, seq: Req, steps: int) -> int:
        """Drafts accepted in one verify: position i passes with its rate, the first miss ends."""
        if steps == 0:
            return 0
        accepted = 0
        rng = self._rng.random
        for rate in seq.rates[:steps]:
            if rng() >= rate:
                break
            accepted += 1
        seq.verify_ct += 1
        seq.proposed_drafts += steps
        seq.correct_drafts += accepted
        if len(seq.histogram) <= accepted:
            seq.histogram.extend([0] * (accepted + 1 - len(seq.histogram)))
        seq.histogram[accepted] += 1
        if seq.steps_log is not None:
            seq.steps_log.append((steps, accepted))
        return accepted

    def _emit(self, seq: Req, tokens: int) -> Emission:
        tokens = min(tokens, seq.target_tokens - seq.generated)
        seq.generated += tokens
        reason = None
        if seq.generated >= seq.target_tokens:
            reason = "length" if seq.generated >= seq.max_new_tokens else "stop"
            seq.finish_reason = reason
            seq.finished_at = self.clock
            self._by_rid.pop(seq.rid, None)
        return Emission(seq, tokens, reason)

    def _draw_length(self) -> int:
        """Natural output length: log-normal around the profile's mean, sigma 0.6."""
        sigma = 0.6
        mu = math.log(self.profile.mean_output_tokens) - sigma * sigma / 2
        return max(1, round(self._rng.lognormvariate(mu, sigma)))

    def _draw_rates(self, klass: str) -> tuple[float, ...]:
        """This request's per-position acceptance: the class mean scaled by a Beta draw."""
        depth = self.deepest_steps
        mean = self.profile.rates(klass, depth)
        if not mean:
            return ()
        first = mean[0]
        if first >= 1.0 or first <= 0.0:
            return mean
        kappa = self.profile.spread
        own_first = self._rng.betavariate(kappa * first, kappa * (1.0 - first))
        scale = own_first / first
        return tuple(min(1.0, a * scale) for a in mean)
