"""The limits of one attempt, predicted before anything is learned: tight for a small request on
an idle backend, longer for a long prompt, a full backend or many tokens, never past their
ceilings; what a backend has shown only widens them."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from specroute.config import TimeoutConfig
from specroute.pool.deadlines import BYTES_PER_TOKEN, AttemptLimits, Deadlines, Load
from specroute.pool.estimators import DurationHistogram, IterationTimeModel

IDLE = Load(in_flight=1, capacity=64, steps=3, mean_tokens=300.0)


def _limits(
    *,
    stream: bool = True,
    prompt_bytes: int = 300,
    max_tokens: int | None = 16,
    load: Load = IDLE,
    seen: DurationHistogram | None = None,
    config: TimeoutConfig | None = None,
) -> AttemptLimits:
    return Deadlines(config or TimeoutConfig()).for_attempt(
        stream=stream,
        prompt_bytes=prompt_bytes,
        max_tokens=max_tokens,
        iteration=IterationTimeModel(),
        load=load,
        first_seen=seen or DurationHistogram(),
    )


def test_a_small_stream_on_an_idle_backend_gets_limits_of_a_few_seconds_by_default() -> None:
    limits = _limits()
    assert limits.header_s == 5.0
    assert 5.0 < limits.first_s < 6.0
    assert limits.gap_s == 5.0


def test_a_long_prompt_and_a_full_backend_each_lengthen_the_wait_for_a_first_token() -> None:
    small = _limits().first_s
    long_prompt = _limits(prompt_bytes=int(100_000 * BYTES_PER_TOKEN)).first_s
    queued = _limits(load=Load(in_flight=128, capacity=64, steps=3, mean_tokens=300.0)).first_s
    # 100k tokens at the default 0.3 ms each is a 30 s prefill; a batch ahead, 300 iterations.
    assert long_prompt > small + 4 * 29
    assert queued > small + 4 * 20
    assert _limits(prompt_bytes=10**9).first_s == TimeoutConfig().first_byte_s


def test_a_whole_reply_is_allowed_time_for_its_max_tokens_and_waits_that_long_for_headers() -> None:
    short = _limits(stream=False, max_tokens=8)
    long = _limits(stream=False, max_tokens=4000)
    assert short.header_s == short.reply_s  # SGLang sends its headers with its end
    assert short.reply_s < 7.0
    assert long.reply_s > short.reply_s + 4 * 3990 * 0.02
    assert _limits(stream=False, max_tokens=None).reply_s > long.reply_s  # assumed_max_tokens
    assert _limits(stream=False, max_tokens=10**9).reply_s == TimeoutConfig().reply_s


@given(st.lists(st.floats(0.001, 2000.0), min_size=16, max_size=64))
def test_learned_first_token_times_only_widen_the_limit_and_never_past_its_ceiling(
    samples: list[float],
) -> None:
    seen = DurationHistogram()
    seen.add_all(samples)
    learned = _limits(seen=seen).first_s
    assert _limits().first_s <= learned <= TimeoutConfig().first_byte_s


def test_a_slow_backend_prior_lengthens_the_gap_limit_above_its_floor() -> None:
    config = TimeoutConfig()
    slow = IterationTimeModel(intercept=2.0, slope=0.0)  # a 2 s iteration, as a huge model's
    limits = Deadlines(config).for_attempt(
        stream=True,
        prompt_bytes=300,
        max_tokens=16,
        iteration=slow,
        load=IDLE,
        first_seen=DurationHistogram(),
    )
    assert limits.gap_s == config.margin * 2.0


def test_a_queued_reply_decodes_at_the_backends_full_batch_not_behind_its_queue() -> None:
    """Past capacity the request waits its turn (the first-token limit); once running, its
    iterations are those of a full batch, not of everything sent to the backend."""
    full = Load(in_flight=64, capacity=64, steps=3, mean_tokens=300.0)
    queued = Load(in_flight=256, capacity=64, steps=3, mean_tokens=300.0)
    at_full = _limits(stream=False, max_tokens=1000, load=full)
    behind = _limits(stream=False, max_tokens=1000, load=queued)
    decode_full = at_full.reply_s - at_full.first_s
    decode_behind = behind.reply_s - behind.first_s
    assert behind.first_s > at_full.first_s
    assert abs(decode_behind - decode_full) < 1e-9 * decode_full
