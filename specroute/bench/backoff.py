"""How closed-loop users treat a target they cannot reach: after a request that got no HTTP
answer, one probe at a time, spaced by a pause that doubles up to a cap; any answer resumes all;
a level that gets no answer for `give_up_s` ends early."""

from __future__ import annotations

__all__ = ["ConnectBackoff"]


class ConnectBackoff:
    """Pure state machine; the caller passes `now` (monotonic seconds). While the target is
    unreachable, at most one request is in flight and tries are `first_s`, then twice that, ...
    up to `cap_s` apart: a dead port costs about one attempt per `cap_s`, not one per user per
    round trip. It lives as long as the client, so a later level starts already careful."""

    __slots__ = ("_delay", "_down_since", "_next_try", "_probing", "cap_s", "first_s", "give_up_s")

    def __init__(self, first_s: float = 0.05, cap_s: float = 1.0, give_up_s: float = 10.0) -> None:
        self.first_s, self.cap_s, self.give_up_s = first_s, cap_s, give_up_s
        self._down_since: float | None = None
        self._delay = first_s
        self._next_try = 0.0
        self._probing = False

    @property
    def down(self) -> bool:
        return self._down_since is not None

    def start_level(self, now: float) -> None:
        """A new level may probe at once, and gets its own `give_up_s`."""
        if self._down_since is not None:
            self._down_since, self._next_try, self._probing = now, now, False

    def wait_s(self, now: float) -> float | None:
        """0 when a request may go now (taking the probe's turn while down), None when this
        level should stop (no answer for `give_up_s`), else how long to wait and ask again."""
        if self._down_since is None:
            return 0.0
        if now - self._down_since > self.give_up_s:
            return None
        if self._probing:
            return self.first_s  # ask again soon: the probe's answer resumes everyone
        if now < self._next_try:
            return self._next_try - now
        self._probing = True
        return 0.0

    def record(self, *, reached: bool, now: float) -> None:
        """A request ended: `reached` when the target answered with any HTTP status."""
        if reached:
            self._down_since, self._probing, self._delay = None, False, self.first_s
            return
        if self._down_since is None:
            self._down_since = now
        elif not self._probing:
            return  # sent before the target went down: the pause already runs
        else:
            self._delay = min(self._delay * 2, self.cap_s)
        self._probing = False
        self._next_try = now + self._delay
