"""Policies by name: the built-ins plus anything registered in the `specroute.policies` entry
point group (each entry point names a zero-argument callable returning a `Policy`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib.metadata import entry_points

from specroute.policies.builtin import LeastLoaded, RoundRobin
from specroute.policies.types import Policy

__all__ = ["ENTRY_POINT_GROUP", "PolicyFactory", "UnknownPolicyError", "available", "create"]

ENTRY_POINT_GROUP = "specroute.policies"
PolicyFactory = Callable[[], Policy]

BUILTIN: Mapping[str, PolicyFactory] = {
    RoundRobin.name: RoundRobin,
    LeastLoaded.name: LeastLoaded,
}


class UnknownPolicyError(LookupError):
    """No policy of that name; the message lists the choices."""


def available() -> dict[str, PolicyFactory]:
    """Every policy that can be chosen by name; built-ins win a name clash."""
    found: dict[str, PolicyFactory] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        found[ep.name] = ep.load()
    found.update(BUILTIN)
    return found


def create(name: str) -> Policy:
    """A fresh policy instance by name."""
    factories = available() if name not in BUILTIN else BUILTIN
    try:
        factory = factories[name]
    except KeyError:
        choices = ", ".join(sorted(available()))
        raise UnknownPolicyError(f"unknown policy {name!r}; choose one of: {choices}") from None
    return factory()
