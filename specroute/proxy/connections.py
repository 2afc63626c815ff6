"""Who may hold the proxy's client connections: a total, a limit per peer address, and a reserve
that only connections presenting a valid key may use, so that keyless clients, however many,
cannot lock out the ones with a key. Pure bookkeeping: the server protocol does the closing."""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable
from typing import Generic, TypeVar

__all__ = ["ConnectionTable"]

C = TypeVar("C", bound=Hashable)


class ConnectionTable(Generic[C]):
    """Open connections and what they may claim. A connection is keyless from its accept until a
    request of its own presents a valid key, and again after any request that does not. Keyless
    connections may hold `limit - reserve` slots; a keyed one is never closed to make room. When
    a newcomer finds keyless connections at their share or every slot taken, the keyless one
    idle longest (waiting for a request, none in progress) is closed for it; with none idle, a
    newcomer past the total is refused, and one past the share must show a key or be refused."""

    __slots__ = ("_idle", "_keyless", "_limit", "_peer_limit", "_peers", "_per_peer", "_share")

    def __init__(self, limit: int, *, reserve: int = 0, per_peer: int | None = None) -> None:
        if not 0 <= reserve < limit:
            raise ValueError(f"reserve {reserve} must be at least 0 and less than limit {limit}")
        self._limit = limit
        self._share = limit - reserve
        self._peer_limit = per_peer
        self._peers: dict[C, str] = {}
        self._per_peer: Counter[str] = Counter()
        self._keyless: set[C] = set()
        self._idle: dict[C, None] = {}  # keyless and idle, longest idle first

    def __len__(self) -> int:
        return len(self._peers)

    @property
    def keyless(self) -> int:
        """Open connections that have not presented a valid key on their latest request."""
        return len(self._keyless)

    def admit(self, conn: C, peer: str) -> tuple[bool, C | None]:
        """Count a new connection from `peer` in: (admitted, the connection to close for it)."""
        if self._peer_limit is not None and self._per_peer[peer] >= self._peer_limit:
            return False, None
        victim = None
        if len(self._peers) >= self._limit or len(self._keyless) >= self._share:
            victim = next(iter(self._idle), None)
            if victim is not None:
                self.release(victim)
            elif len(self._peers) >= self._limit:
                return False, None
        self._peers[conn] = peer
        if self._peer_limit is not None:
            self._per_peer[peer] += 1
        self._keyless.add(conn)
        self._idle[conn] = None
        return True, victim

    def request(self, conn: C, *, keyed: bool) -> bool:
        """A request's headers are in: False when it is keyless and keyless connections hold
        more than their share (refuse it and close the connection)."""
        if conn not in self._peers:
            return False  # closed to make room already
        self._idle.pop(conn, None)
        if keyed:
            self._keyless.discard(conn)
            return True
        self._keyless.add(conn)
        return len(self._keyless) <= self._share

    def idle(self, conn: C) -> None:
        """The connection's reply is done and no request is in progress on it."""
        if conn in self._keyless:
            self._idle[conn] = None

    def release(self, conn: C) -> None:
        """The connection is closed (or about to be); releasing it twice is harmless."""
        peer = self._peers.pop(conn, None)
        if peer is None:
            return
        self._keyless.discard(conn)
        self._idle.pop(conn, None)
        if self._peer_limit is not None:
            left = self._per_peer[peer] - 1
            if left:
                self._per_peer[peer] = left
            else:
                del self._per_peer[peer]
