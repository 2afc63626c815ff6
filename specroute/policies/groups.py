"""Backends grouped by configuration (depth, adaptive, capacity), each group's members kept in
buckets by load as their counts change, so a policy predicts once per group and finds a group's
least loaded member without reading every backend: decisions scale with the configurations."""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import overload

from specroute.policies.types import BackendView, CandidateSet, PoolView

__all__ = [
    "Candidates",
    "Group",
    "GroupKey",
    "Groups",
    "LazyBackends",
    "batch",
    "candidates_of",
    "level",
]

GroupKey = tuple[int, bool, int | None]
"""(depth, adaptive, capacity): backends that agree on these get the same prediction."""
Usable = Callable[[BackendView], bool]


def batch(backend: BackendView) -> int:
    """Requests on the backend as far as this proxy knows: the pool's combined count (its last
    scrape plus this proxy's changes since), else this proxy's own."""
    return backend.in_flight if backend.combined is None else backend.combined


def level(backend: BackendView) -> int:
    """A member's place in its group, lowest first: slots used from this proxy's point of view
    (capacity less its headroom where the pool says), else requests there and queued."""
    if backend.headroom is not None and backend.capacity is not None:
        return backend.capacity - backend.headroom
    return batch(backend) + (max(0, backend.queued or 0) if backend.combined is None else 0)


def key_of(backend: BackendView) -> GroupKey:
    return (backend.steps or 0, backend.adaptive, backend.capacity)


def _always(_: BackendView) -> bool:
    return True


class _Member:
    __slots__ = ("group", "level", "name", "position", "view")

    def __init__(self, view: BackendView, position: int, group: Group) -> None:
        self.name = view.name
        self.view = view
        self.position = position
        self.group = group
        self.level = level(view)

    def __lt__(self, other: _Member) -> bool:
        return self.position < other.position


class Group:
    """Members of one configuration in buckets by level; each bucket in pool order."""

    __slots__ = ("_buckets", "_levels", "adaptive", "capacity", "key", "steps")

    def __init__(self, key: GroupKey) -> None:
        self.key = key
        self.steps, self.adaptive, self.capacity = key
        # Each bucket as (position, slot), in pool order: tuples compare in C, without the slot.
        self._buckets: dict[int, list[tuple[int, _Member]]] = {}
        self._levels: list[int] = []  # the levels that have members, ascending

    def __len__(self) -> int:
        return sum(len(b) for b in self._buckets.values())

    def _add(self, slot: _Member) -> None:
        bucket = self._buckets.get(slot.level)
        if bucket is None:
            bucket = self._buckets[slot.level] = []
            bisect.insort(self._levels, slot.level)
        bisect.insort(bucket, (slot.position, slot))

    def _drop(self, slot: _Member) -> None:
        bucket = self._buckets[slot.level]
        del bucket[bisect.bisect_left(bucket, (slot.position,))]
        if not bucket:
            del self._buckets[slot.level]
            del self._levels[bisect.bisect_left(self._levels, slot.level)]

    def members(self) -> Iterator[BackendView]:
        """Every member, least loaded first (pool order within a level)."""
        for lvl in self._levels:
            yield from (s.view for _, s in self._buckets[lvl])

    def best(self, usable: Usable = _always, turn: int = 0) -> BackendView | None:
        """The least loaded member that `usable` accepts; among equals, the `turn`-th in pool
        order (round robin over calls); looks at members only until one is accepted."""
        for lvl in self._levels:
            bucket = self._buckets[lvl]
            start = turn % len(bucket)
            for i in range(len(bucket)):
                view = bucket[(start + i) % len(bucket)][1].view
                if usable(view):
                    return view
        return None


class Groups:
    """The live index: members by name, in groups, in pool order; running totals of load and
    capacity. `put` a backend's new view whenever its load, health or estimates change."""

    def __init__(self) -> None:
        self._slots: dict[str, _Member] = {}
        self._groups: dict[GroupKey, Group] = {}
        self._order: list[_Member] = []  # by position: round robin
        self.batch_total = 0
        self.capacity_total = 0
        self._unknown_capacity = 0

    @classmethod
    def of(cls, backends: Iterable[BackendView]) -> Groups:
        groups = cls()
        for position, view in enumerate(backends):
            groups.put(view, position)
        return groups

    def __len__(self) -> int:
        return len(self._slots)

    def __contains__(self, name: object) -> bool:
        return name in self._slots

    def get(self, name: str) -> BackendView | None:
        slot = self._slots.get(name)
        return None if slot is None else slot.view

    def groups(self) -> Iterable[Group]:
        return self._groups.values()

    def ordered(self) -> Sequence[BackendView]:
        return [s.view for s in self._order]

    def nth(self, index: int) -> BackendView:
        return self._order[index % len(self._order)].view

    @property
    def capacity_known(self) -> bool:
        return self._unknown_capacity == 0

    def put(self, view: BackendView, position: int) -> None:
        """Add a backend or replace its view; `position` is its place in the pool's order."""
        old = self._slots.get(view.name)
        if old is not None and old.position == position and old.group.key == key_of(view):
            self._count(old.view, -1)
            self._count(view, 1)
            old.view = view
            new_level = level(view)
            if new_level != old.level:  # same group, another bucket
                old.group._drop(old)
                old.level = new_level
                old.group._add(old)
            return
        if old is not None:
            self.remove(view.name)
        key = key_of(view)
        group = self._groups.get(key)
        if group is None:
            group = self._groups[key] = Group(key)
        slot = _Member(view, position, group)
        group._add(slot)
        self._slots[view.name] = slot
        bisect.insort(self._order, slot)
        self._count(view, 1)

    def remove(self, name: str) -> None:
        slot = self._slots.pop(name, None)
        if slot is None:
            return
        slot.group._drop(slot)
        if not len(slot.group):
            del self._groups[slot.group.key]
        del self._order[bisect.bisect_left(self._order, slot)]
        self._count(slot.view, -1)

    def _count(self, view: BackendView, sign: int) -> None:
        self.batch_total += sign * batch(view)
        if view.capacity is None:
            self._unknown_capacity += sign
        else:
            self.capacity_total += sign * view.capacity


class Candidates:
    """The backends one request may go to: a `Groups` index and a test of each member (health,
    circuit, limit, exclusions) applied only to the members a policy looks at."""

    def __init__(self, groups: Groups, usable: Usable = _always) -> None:
        self.index = groups
        self.usable = usable

    @classmethod
    def of(cls, backends: Iterable[BackendView]) -> Candidates:
        return cls(Groups.of(backends))

    def bests(self, turn: int = 0) -> list[BackendView]:
        """Each group's least loaded usable member (groups with none left out)."""
        usable, out = self.usable, []
        for group in self.index.groups():
            best = group.best(usable, turn)
            if best is not None:
                out.append(best)
        return out

    def any(self) -> bool:
        return any(g.best(self.usable) is not None for g in self.index.groups())

    def get(self, name: str) -> BackendView | None:
        found = self.index.get(name)
        return found if found is not None and self.usable(found) else None

    def next_from(self, index: int) -> tuple[int, BackendView] | None:
        """The first usable member at or after `index` in pool order (wrapping round), with
        its index."""
        count = len(self.index)
        for i in range(count):
            view = self.index.nth(index + i)
            if self.usable(view):
                return (index + i) % count, view
        return None

    def __iter__(self) -> Iterator[BackendView]:
        return (b for b in self.index.ordered() if self.usable(b))


class LazyBackends(Sequence[BackendView]):
    """`PoolView.backends` for a view built on `Candidates`: the usable members in pool order,
    listed only if a policy asks (the built-in ones read the groups instead)."""

    def __init__(self, candidates: CandidateSet) -> None:
        self._candidates = candidates
        self._items: tuple[BackendView, ...] | None = None

    def _all(self) -> tuple[BackendView, ...]:
        if self._items is None:
            self._items = tuple(self._candidates)
        return self._items

    @overload
    def __getitem__(self, index: int) -> BackendView: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[BackendView]: ...
    def __getitem__(self, index: int | slice) -> BackendView | Sequence[BackendView]:
        return self._all()[index]

    def __len__(self) -> int:
        return len(self._all())

    def __iter__(self) -> Iterator[BackendView]:
        return iter(self._all())


def candidates_of(view: PoolView) -> CandidateSet:
    """The view's live groups from the pool, else its `backends` grouped now (a view built by
    hand: a test, a simulator)."""
    return view.candidates if view.candidates is not None else Candidates.of(view.backends)
