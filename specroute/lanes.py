"""Latency lanes: `interactive` requests are served for their own speed, `batch` requests for the
pool's throughput. The lanes' configuration and the pure rule that picks a request's lane."""

from __future__ import annotations

from typing import Annotated, Final, Literal

import msgspec

__all__ = ["BATCH", "INTERACTIVE", "LANES", "Lane", "LanesConfig", "lane_of", "tier_lane"]

Lane = Literal["interactive", "batch"]
INTERACTIVE: Final = "interactive"
BATCH: Final = "batch"
LANES: Final[tuple[Lane, ...]] = (INTERACTIVE, BATCH)

_TIERS: Final[dict[str, Lane]] = {"priority": INTERACTIVE, "flex": BATCH}
"""OpenAI's `service_tier` values that name a lane; `auto` and `default` follow the config."""


class LanesConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Which lane a request is in, and what each lane is served for.

    A request's lane is, first match wins: the `x-specroute-lane` header from a key that may
    name its class (`class_keys`, the admin key, or anyone without `api_keys`); its key
    (`interactive_keys`, `batch_keys`); OpenAI's `service_tier` (`priority`: interactive,
    `flex`: batch, `auto` and `default`: `tier_default`); else `default`. Interactive requests
    go where their predicted speed beats `target_tok_s` (or `target_tpot_ms`) by the most;
    batch ones where they add the most throughput, leaving the last `reserve` slots of each
    deepest server to the interactive lane while an interactive request waits."""

    default: Lane = BATCH
    """The lane of a request nothing else names one for."""
    tier_default: Annotated[Lane, msgspec.Meta(examples=["interactive"])] | None = None
    """The lane of `service_tier: auto` or `default`; unset: `default`."""
    interactive_keys: tuple[str, ...] = ()
    """API keys whose requests are interactive (unless the request names another lane)."""
    batch_keys: tuple[str, ...] = ()
    """API keys whose requests are batch (unless the request names another lane)."""
    target_tok_s: Annotated[float, msgspec.Meta(ge=0)] = 0.0
    """The interactive lane's per-request decode speed target; 0: as fast as possible."""
    target_tpot_ms: Annotated[float, msgspec.Meta(gt=0, examples=[10.0])] | None = None
    """The same target as time per output token; when set it replaces `target_tok_s`."""
    reserve: Annotated[int, msgspec.Meta(ge=0)] = 0
    """Slots on each deepest server (and its queue past them) that batch requests take only
    while no interactive request waits for one (in a queue, or sent shallower). In the proxy's
    queue a waiting batch request lets at most this many (at least one) interactive requests
    go ahead of it."""
    engine_priority: bool = False
    """Send the lane as the request's `priority` (servers run `--enable-priority-scheduling`;
    off: SGLang ignores it, or aborts with `--abort-on-priority-when-disabled`)."""
    interactive_priority: int = 1
    """`priority` of interactive requests: SGLang runs larger values first (swap the two when
    it runs low values first), and preempts a running request only for one more than 10 above
    it (`--priority-scheduling-preemption-threshold`)."""
    batch_priority: int = 0
    """`priority` of batch requests."""

    def __post_init__(self) -> None:
        both = set(self.interactive_keys) & set(self.batch_keys)
        if both:
            raise ValueError("a key cannot be in both interactive_keys and batch_keys")

    @property
    def target(self) -> float:
        """The interactive lane's target in tokens per second (0: none)."""
        if self.target_tpot_ms is not None:
            return 1000.0 / self.target_tpot_ms
        return self.target_tok_s

    def priority(self, lane: Lane) -> int:
        """The engine `priority` a request of `lane` is sent with."""
        return self.interactive_priority if lane == INTERACTIVE else self.batch_priority


def tier_lane(config: LanesConfig, tier: str | None) -> Lane | None:
    """The lane OpenAI's `service_tier` names: None when absent or unknown."""
    if tier is None:
        return None
    if tier in ("auto", "default"):
        return config.tier_default
    return _TIERS.get(tier)


def lane_of(
    config: LanesConfig,
    *,
    header: bytes | None,
    trusted: bool,
    key_lane: Lane | None,
    tier: str | None,
) -> Lane:
    """A request's lane: a trusted `x-specroute-lane` header, its key's lane, its
    `service_tier`, else the default. An untrusted or unknown header is ignored."""
    if header is not None and trusted:
        named = header.decode("latin-1").strip().lower()
        if named in LANES:
            return INTERACTIVE if named == INTERACTIVE else BATCH
    return key_lane or tier_lane(config, tier) or config.default
