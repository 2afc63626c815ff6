"""The stream relays of a request that may move (`migrate`): `Tap` keeps what a move needs of
each event it relays; `Continued` relays a continuation as the first reply would have sent it
(its `id`, `created` and `model`; for `/generate`, the whole output so far in front), with the
usage counting the text relayed before the move as completion, not prompt, tokens."""

from __future__ import annotations

from typing import Any

import msgspec

from specroute.pool import BadReply
from specroute.proxy.chunks import EventFilter
from specroute.proxy.fields import Extras
from specroute.proxy.migrate import Migration, NativeEvent
from specroute.sse import EventTooLarge

__all__ = ["Continued", "Tap"]

_ANY = msgspec.json.Decoder(dict[str, Any])
_encode = msgspec.json.Encoder().encode


class Tap(EventFilter):
    """A stream relay that also keeps what a migration needs of each event it relays."""

    __slots__ = ("migration",)

    def __init__(
        self,
        migration: Migration,
        extras: Extras,
        started: float,
        max_event_bytes: int | None = None,
    ) -> None:
        super().__init__(extras, started, max_event_bytes)
        self.migration = migration
        self._take = migration.take


class Continued(Tap):
    """The continuation's stream: each event carries the first reply's `id`, `created` and
    `model`; its usage counts the `relayed` tokens as completion, not prompt, tokens."""

    __slots__ = ("_envelope", "_first", "_relayed")

    def __init__(
        self,
        migration: Migration,
        relayed: int,
        extras: Extras,
        started: float,
        max_event_bytes: int | None = None,
    ) -> None:
        super().__init__(migration, extras, started, max_event_bytes)
        self._relayed = relayed
        self._first = migration.native() if migration.route == "generate" else NativeEvent()
        names = ("id", "created", "model")
        envelope = zip(names, migration.envelope(), strict=True)
        self._envelope: list[tuple[str, object]] = [(k, v) for k, v in envelope if v is not None]

    def feed(self, data: bytes, now: float) -> bytes:
        try:
            events = self._splitter.feed(data)
        except EventTooLarge as exc:
            raise BadReply(str(exc)) from exc
        out = []
        for event, payload in events:
            if payload is not None and payload[:1] == b"{" and payload[-1:] == b"}":
                payload = self._rewrite(payload)
                event = b"data: " + payload + b"\n\n"
            if self._keep(payload, now):
                out.append(event)
        return b"".join(out)

    def _rewrite(self, payload: bytes) -> bytes:
        try:
            data = _ANY.decode(payload)
        except msgspec.DecodeError:
            return payload  # the relay's own check calls it malformed
        m = self.migration
        if m.route == "generate":
            return _encode(self._native(data))
        for key, value in self._envelope:  # the first reply's
            if key in data:
                data[key] = value
        usage = data.get("usage")
        if isinstance(usage, dict):
            prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
            if isinstance(prompt, int) and isinstance(completion, int):
                usage["prompt_tokens"] = max(0, prompt - self._relayed)
                usage["completion_tokens"] = completion + self._relayed
        return _encode(data)

    def _native(self, data: dict[str, Any]) -> dict[str, Any]:
        """A `/generate` event of the continuation as the first reply would have sent it: the
        text and ids so far in front, the first reply's id, the usage summed."""
        first = self._first
        if isinstance(data.get("text"), str):
            data["text"] = first.text + data["text"]
        if isinstance(data.get("output_ids"), list):
            data["output_ids"] = [*first.output_ids, *data["output_ids"]]
        meta = data.get("meta_info")
        if isinstance(meta, dict):
            if first.meta_info is not None and first.meta_info.id is not None:
                meta["id"] = first.meta_info.id
            prompt, completion = meta.get("prompt_tokens"), meta.get("completion_tokens")
            if isinstance(prompt, int) and isinstance(completion, int):
                meta["prompt_tokens"] = max(0, prompt - self._relayed)
                meta["completion_tokens"] = completion + self._relayed
        return data
