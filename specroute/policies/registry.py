"""Policies by name: the built-ins plus anything registered in the `specroute.policies` entry
point group (each entry point names a callable returning a `Policy`).

A policy that takes options exposes them as an `Options` msgspec Struct on its factory and
accepts one instance as its only argument. Options come as a mapping (config, PUT /policy) or
in a spec string, `throughput:objective=goodput,floor_tok_s=40`, usable wherever a name is.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib.metadata import entry_points
from typing import Any

import msgspec

from specroute.policies.bandit import Bandit
from specroute.policies.builtin import LeastLoaded, RoundRobin
from specroute.policies.static import Static
from specroute.policies.threshold import Threshold
from specroute.policies.throughput import Throughput
from specroute.policies.types import Policy
from specroute.structdoc import describe_type, field_docs, misspelt_hint

__all__ = [
    "ENTRY_POINT_GROUP",
    "OptionHelp",
    "PolicyFactory",
    "UnknownPolicyError",
    "available",
    "create",
    "option_help",
    "options_of",
    "parse_spec",
    "pinned_depth",
]

ENTRY_POINT_GROUP = "specroute.policies"
PolicyFactory = Callable[..., Policy]

BUILTIN: Mapping[str, PolicyFactory] = {
    RoundRobin.name: RoundRobin,
    LeastLoaded.name: LeastLoaded,
    Static.name: Static,
    Threshold.name: Threshold,
    Throughput.name: Throughput,
    Bandit.name: Bandit,
}


class UnknownPolicyError(LookupError):
    """No policy of that name, or options it does not take; the message says which."""


def available() -> dict[str, PolicyFactory]:
    """Every policy that can be chosen by name; built-ins win a name clash."""
    found: dict[str, PolicyFactory] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        found[ep.name] = ep.load()
    found.update(BUILTIN)
    return found


def options_of(factory: PolicyFactory) -> type[msgspec.Struct] | None:
    """The factory's options type, if it takes options."""
    kind = getattr(factory, "Options", None)
    return kind if isinstance(kind, type) and issubclass(kind, msgspec.Struct) else None


class OptionHelp(msgspec.Struct, frozen=True, kw_only=True):
    """One option as `specroute policies` shows it, read from the options type itself."""

    name: str
    kind: str  # `integer >= 0`, `latency|throughput|goodput`, ...
    default: str
    doc: str | None = None


def option_help(factory: PolicyFactory) -> tuple[OptionHelp, ...]:
    """The factory's options: name, type and allowed values, default, and field docstring."""
    kind = options_of(factory)
    if kind is None:
        return ()
    info = msgspec.inspect.type_info(kind)
    assert isinstance(info, msgspec.inspect.StructType)
    defaults = msgspec.to_builtins(kind())
    docs = field_docs(kind)
    return tuple(
        OptionHelp(
            name=f.name,
            kind=describe_type(f.type),
            default="unset" if defaults.get(f.name) is None else str(defaults[f.name]),
            doc=docs.get(f.name),
        )
        for f in info.fields
    )


def pinned_depth(policy: Policy) -> int | None:
    """The one depth a policy sends every request to (`static`'s steps), if it has one: a pool
    without a backend at that depth cannot do what the operator asked."""
    return policy.options.steps if isinstance(policy, Static) else None


def parse_spec(spec: str) -> tuple[str, dict[str, str]]:
    """`name:key=value,key=value` into the name and its (string) options."""
    name, _, rest = spec.partition(":")
    options: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, sep, value = item.partition("=")
        if not sep:
            raise UnknownPolicyError(f"policy option {item!r} is not key=value")
        options[key.strip()] = value.strip()
    return name.strip(), options


def create(spec: str, options: Mapping[str, Any] | None = None) -> Policy:
    """A fresh policy by name or spec string; `options` override those in the spec."""
    name, merged = parse_spec(spec)
    factories = BUILTIN if name in BUILTIN else available()
    try:
        factory = factories[name]
    except KeyError:
        choices = ", ".join(sorted(available()))
        raise UnknownPolicyError(f"unknown policy {name!r}; choose one of: {choices}") from None
    values: dict[str, Any] = {**merged, **(options or {})}
    kind = options_of(factory)
    if kind is None:
        if values:
            raise UnknownPolicyError(f"policy {name!r} takes no options")
        return factory()
    try:
        return factory(msgspec.convert(values, kind, strict=False))
    except (msgspec.ValidationError, ValueError) as exc:
        hint = misspelt_hint(str(exc), kind, f"; `specroute policies` lists {name}'s options")
        raise UnknownPolicyError(f"bad options for policy {name!r}: {exc}{hint}") from exc
