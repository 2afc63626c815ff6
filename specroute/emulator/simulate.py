"""Closed-loop load on an Engine in virtual time: what a profile predicts, without HTTP or clocks.

Used to fit and document profiles and to check the engine's statistics; the HTTP calibration
(`specroute calibrate`) measures the same figures over real sockets.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from specroute.emulator.adaptive import DEFAULT_ADAPTIVE_CONFIG, AdaptiveConfig
from specroute.emulator.engine import Engine, Req
from specroute.emulator.profiles import Profile

__all__ = ["LevelResult", "run_closed_loop"]


@dataclass(frozen=True, slots=True)
class LevelResult:
    concurrency: int
    requests: int
    per_request_tok_s: float
    """Mean over requests of 1 / TPOT = (completion tokens - 1) / (last - first token time)."""
    aggregate_tok_s: float
    """All completion tokens over the time from the first send to the last finish."""
    sequences: tuple[Req, ...]


def run_closed_loop(
    profile: Profile,
    *,
    steps: int,
    concurrency: int,
    requests: int,
    output_tokens: int,
    prompt_tokens: int,
    klass: str = "greedy",
    ignore_eos: bool = True,
    seed: int = 0,
    adaptive: bool = False,
    adaptive_config: AdaptiveConfig = DEFAULT_ADAPTIVE_CONFIG,
    max_running_requests: int | None = None,
) -> LevelResult:
    """`concurrency` users each send their next request as soon as the previous one ends."""
    engine = Engine(
        profile,
        steps=steps,
        seed=seed,
        adaptive=adaptive,
        adaptive_config=adaptive_config,
        max_running_requests=max_running_requests,
    )
    sent = 0

    def send() -> None:
        nonlocal sent
        engine.submit(
            f"req-{sent}",
            prompt_tokens=prompt_tokens,
            max_new_tokens=output_tokens,
            klass=klass,
            ignore_eos=ignore_eos,
        )
        sent += 1

    for _ in range(min(concurrency, requests)):
        send()
    done: list[Req] = []
    tokens = 0
    while (iteration := engine.step()) is not None:
        for emission in iteration.emissions:
            tokens += emission.tokens
            if emission.finish_reason is not None:
                done.append(emission.seq)
                if sent < requests:
                    send()
    speeds = [
        (s.generated - 1) / (s.finished_at - s.first_token_at)
        for s in done
        if s.generated > 1 and s.finished_at is not None and s.first_token_at is not None
    ]
    return LevelResult(
        concurrency=concurrency,
        requests=len(done),
        per_request_tok_s=statistics.fmean(speeds) if speeds else 0.0,
        aggregate_tok_s=tokens / engine.clock if engine.clock else 0.0,
        sequences=tuple(done),
    )
