"""A backend's load when several proxies share it: its last scrape (`num_running_reqs` plus
`num_queue_reqs`, every client's) combined with this proxy's own changes since, and the room
this proxy may take without overrunning the others' share. Pure arithmetic, clock passed in.

The others' requests are the scrape less this proxy's own, taken at its peak over the time the
gauges may lag by: a request of ours that ended after they were written would otherwise count
as someone else's (and hold back a slot that is free). Among replicas, a backend's slots are
split by rank, slot by slot: its capacity by default, so that requests another replica sent a
moment ago, not yet in the gauges, never share a slot; or the room free at each scrape.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

__all__ = ["LoadMark", "Share", "headroom", "share_of"]


@dataclass(frozen=True, slots=True)
class Share:
    """This proxy's place among the replicas: how many there are, its rank (None: not known
    yet, take only the whole slots of an even split), and a per-backend offset for the split."""

    replicas: int = 1
    rank: int | None = 0


def share_of(free: int, share: Share, offset: int = 0) -> int:
    """Slots of `free` this replica may take: slot j goes to rank (j + offset) mod replicas, so
    the shares of every rank add up to `free` exactly."""
    n = share.replicas
    if free <= 0:
        return 0
    if n <= 1:
        return free
    if share.rank is None:
        return free // n
    first = (share.rank - offset) % n  # the first slot index that is ours
    return 0 if first >= free else (free - first - 1) // n + 1


class LoadMark:
    """One backend's last scrape and this proxy's own in-flight counts around it."""

    __slots__ = ("_history", "at", "others", "own")

    def __init__(self) -> None:
        self.at: float | None = None
        self.own = 0
        self.others = 0
        self._history: deque[tuple[float, int]] = deque()  # (time, own count from then on)

    def moved(self, own: int, now: float, keep_s: float) -> None:
        """This proxy's in-flight count changed (a lease came or went)."""
        history = self._history
        history.append((now, own))
        while len(history) > 1 and history[1][0] < now - keep_s:
            history.popleft()

    def peak(self, own: int, since: float) -> int:
        """This proxy's highest count from `since` on (`own` is its count now)."""
        highest = own
        for at, count in reversed(self._history):
            highest = max(highest, count)
            if at <= since:
                break
        return highest

    def scraped(self, total: int, own: int, now: float, lag_s: float) -> None:
        """A scrape answered: `total` running plus queued there, `own` this proxy's count now.
        The gauges were written up to `lag_s` before: the others are `total` less our peak."""
        self.others = max(0, total - self.peak(own, now - lag_s))
        self.own = own
        self.at = now

    def fresh(self, now: float, stale_after_s: float) -> bool:
        return self.at is not None and now - self.at <= stale_after_s

    def combined(self, own_now: int, now: float, stale_after_s: float) -> int | None:
        """Requests there from every client: the others at the scrape plus ours now; None once
        the scrape is older than `stale_after_s` (it ages out)."""
        if not self.fresh(now, stale_after_s):
            return None
        return own_now + self.others


def headroom(
    mark: LoadMark,
    own_now: int,
    capacity: int | None,
    share: Share,
    *,
    now: float,
    stale_after_s: float,
    offset: int = 0,
    split: str = "capacity",
) -> int | None:
    """Requests this proxy may add before the backend is full; None when its capacity is
    unknown. Alone: the capacity less everyone's load. With other replicas, `split`:
    `capacity`, its share of the backend's slots less its own requests (the scrape is not
    read: at a full pool the gauges' lag would make the others' shares look overrun, and
    clients that bypass the proxies are not the replicas' to make room for); `room`, its share
    of the room free at the last scrape, plus what it freed since, less what it added since
    (its share of the capacity with no fresh scrape)."""
    if capacity is None:
        return None
    fresh = mark.fresh(now, stale_after_s)
    if share.replicas <= 1:
        return capacity - (mark.others if fresh else 0) - own_now
    mine = share_of(capacity, share, offset)
    if split == "capacity" or not fresh:
        return mine - own_now
    free = capacity - mark.others - mark.own
    since = mark.own - own_now  # freed (positive) or taken (negative) by us since the scrape
    if free < 0:  # over capacity at the scrape: what we free first drains its queue
        return free + since
    return share_of(free, share, offset) + since
