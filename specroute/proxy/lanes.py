"""The proxy's side of latency lanes: each request's lane from its key, its headers and its
`service_tier`; the engine `priority` it is forwarded with; a stream's decode speed (what
each lane got is `proxy.lane_stats`)."""

from __future__ import annotations

import msgspec

from specroute.lanes import BATCH, INTERACTIVE, Lane, LanesConfig, lane_of
from specroute.proxy.auth import Auth, bearer, matches

__all__ = [
    "LANE_HEADER",
    "LaneResolver",
    "decode_speed",
    "with_priority",
]

LANE_HEADER = b"x-specroute-lane"
"""The request header a trusted key names its lane with, and the reply header that says it."""


class LaneResolver:
    """Picks each request's lane (`specroute.lanes.lane_of`): the header only from a key that
    may name its class, as `x-specroute-class`; a key's configured lane; `service_tier`."""

    __slots__ = ("_auth", "_batch", "_interactive", "config", "keyed")

    def __init__(self, config: LanesConfig, auth: Auth) -> None:
        self.config = config
        self._auth = auth
        self._interactive = tuple(k.encode() for k in config.interactive_keys)
        self._batch = tuple(k.encode() for k in config.batch_keys)
        self.keyed = bool(self._interactive or self._batch)
        """Whether some keys have a lane of their own (else the key matters only to trust
        a lane header)."""

    def resolve(
        self, authorization: bytes | None, lane_header: bytes | None, tier: str | None
    ) -> Lane:
        if lane_header is None and tier is None and not self.keyed:
            return self.config.default  # what `lane_of` answers when nothing names a lane
        trusted = lane_header is not None and self._auth.may_name_class(authorization)
        return lane_of(
            self.config,
            header=lane_header,
            trusted=trusted,
            key_lane=self._key_lane(authorization),
            tier=tier,
        )

    def _key_lane(self, authorization: bytes | None) -> Lane | None:
        if not self.keyed:
            return None
        token = bearer(authorization)
        if token is None:
            return None
        if matches(token, self._interactive):
            return INTERACTIVE
        return BATCH if matches(token, self._batch) else None


def with_priority(body: bytes, given: object, priority: int) -> bytes:
    """`body` with its top-level `priority` set to `priority`: appended when the client sent
    none (`given` unset), re-encoded when it sent another (the lane decides, not the client)."""
    if given == priority:
        return body
    if given is msgspec.UNSET:
        head = body.rstrip()[:-1].rstrip()
        sep = b"" if head.endswith(b"{") else b","
        return b"".join((head, sep, b'"priority":', str(priority).encode(), b"}"))
    data = msgspec.json.decode(body)
    data["priority"] = priority
    return msgspec.json.encode(data)


def decode_speed(tokens: int | None, first_token_s: float | None, end_s: float) -> float | None:
    """Completion tokens after the first over the time from the first token to the end, both
    from the request's arrival: a stream's own decode speed (None: too little to time)."""
    if tokens is None or tokens < 2 or first_token_s is None or end_s <= first_token_s:
        return None
    return (tokens - 1) / (end_s - first_token_s)
