"""Listening beyond this machine: whether an address is loopback, and the one warning for a
proxy that does so without keys (`serve`, `launch`, the container image all print it)."""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

__all__ = ["is_loopback", "keyless_proxy_warning"]


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 or `localhost`; 0.0.0.0 and every other name reach beyond."""
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host == "localhost"


def keyless_proxy_warning(host: str, api_keys: Sequence[str]) -> str | None:
    """The warning for a proxy on `host` with these keys, or None when it is private or keyed."""
    if is_loopback(host) or api_keys:
        return None
    return (
        f"warning: the proxy listens on {host} without api_keys: anyone who reaches it can use "
        "it (--api-key, api_keys in --config, or SPECROUTE_API_KEYS)"
    )
