"""Typed configuration for `specroute serve`: a TOML file, then `SPECROUTE_*` variables, then flags.

Every section is a frozen msgspec Struct that rejects unknown fields, so a typo fails at start-up
with a message naming its path (`$.backends[1].url`). Nested fields are reachable from the
environment with double underscores: `SPECROUTE_TIMEOUTS__IDLE_S=30`.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec

from specroute.errors import ConfigError

__all__ = [
    "AdmissionConfig",
    "BackendConfig",
    "BreakerConfig",
    "ClientConfig",
    "Config",
    "HealthConfig",
    "LearnConfig",
    "LimitsConfig",
    "RetryConfig",
    "TimeoutConfig",
    "load_config",
]

ENV_PREFIX = "SPECROUTE_"
Positive = Annotated[float, msgspec.Meta(gt=0)]
NonNegative = Annotated[float, msgspec.Meta(ge=0)]
Count = Annotated[int, msgspec.Meta(ge=1)]
Port = Annotated[int, msgspec.Meta(ge=0, le=65535)]


class _Section(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    pass


class BackendConfig(_Section, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One SGLang server. `max_in_flight` overrides the limit derived from its capacity.

    With `resolve_every_s`, the url's host is a DNS name (a Kubernetes headless Service):
    every address it resolves to is a backend, and the name is resolved again on that interval.
    """

    url: str
    name: str | None = None
    api_key: str | None = None
    max_in_flight: Count | None = None
    resolve_every_s: Positive | None = None

    def __post_init__(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"backend url {self.url!r} must start with http:// or https://")

    @property
    def label(self) -> str:
        """The name used in headers, logs and metrics: `name`, else host:port."""
        return self.name or self.url.split("://", 1)[1].rstrip("/")


class HealthConfig(_Section, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Polling of /ready (never /health: it runs a generation), /server_info and /metrics."""

    interval_s: Positive = 2.0
    timeout_s: Positive = 2.0
    failure_threshold: Count = 2
    success_threshold: Count = 2
    discovery_interval_s: Positive = 60.0
    metrics_interval_s: Positive = 5.0


class TimeoutConfig(_Section, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A long prefill before the first byte is normal; a stream idle past `idle_s` is not."""

    connect_s: Positive = 5.0
    first_byte_s: Positive = 900.0
    idle_s: Positive = 120.0


class RetryConfig(_Section, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Attempts (first try included) for failures before the first byte reaches the client."""

    max_attempts: Count = 3
    backoff_s: NonNegative = 0.05
    backoff_max_s: NonNegative = 1.0


class BreakerConfig(_Section, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Consecutive failures that open a backend's circuit, and how long it stays open."""

    failure_threshold: Count = 5
    open_s: Positive = 10.0


class AdmissionConfig(_Section, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The proxy's wait queue for when every backend is at its in-flight limit.

    A backend's limit is `max_in_flight`, else `overcommit` times its `max_running_requests`
    (SGLang queues the surplus itself), else unlimited when its capacity is unknown.
    """

    queue_size: Annotated[int, msgspec.Meta(ge=0)] = 1024
    queue_timeout_s: Positive = 30.0
    overcommit: Annotated[float, msgspec.Meta(ge=1)] = 2.0
    retry_after_s: Positive = 1.0


class LearnConfig(_Section, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What the proxy adds upstream to learn from replies; it strips the extras from the reply."""

    include_usage: bool = True
    spec_tokens_details: bool = True


class ClientConfig(_Section, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The upstream HTTP client: `h1` (HTTP/1.1 on asyncio protocols, measured fastest) or
    `httpx` (httpx's own pool); `max_connections` bounds the proxied requests' pool."""

    transport: Literal["h1", "httpx"] = "h1"
    max_connections: Count = 1024


class LimitsConfig(_Section, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What one client may ask of the proxy: header size and count, time to send its request
    (headers from the connection's opening or the request's first byte, body from the end of
    the headers), open connections (in all, per peer address, and `reserved_connections` that
    only clients with a valid API key may hold: 1/16 of them unless set), how long it may leave
    a stream unread (`client_stall_s`: then the stream ends and its backend is freed); and how
    long streams run on after SIGTERM."""

    max_header_bytes: Count = 64 * 1024
    max_headers: Count = 100
    header_timeout_s: Positive = 10.0
    body_timeout_s: Positive = 60.0
    client_stall_s: Positive = 60.0
    max_connections: Count = 4096
    reserved_connections: Annotated[int, msgspec.Meta(ge=0)] | None = None
    max_connections_per_peer: Count | None = None
    shutdown_grace_s: NonNegative = 30.0

    def __post_init__(self) -> None:
        if self.reserve >= self.max_connections:
            raise ValueError("reserved_connections must be less than max_connections")

    @property
    def reserve(self) -> int:
        """Connections only keyed clients may hold (when API keys are configured)."""
        given = self.reserved_connections
        return self.max_connections // 16 if given is None else given


class Config(_Section, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Everything `specroute serve` needs."""

    backends: tuple[BackendConfig, ...] = ()
    host: str = "127.0.0.1"
    port: Port = 8000
    policy: str = "throughput"
    api_keys: tuple[str, ...] = ()
    admin_key: str | None = None
    max_body_bytes: Count = 32 * 1024 * 1024
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    health: HealthConfig = msgspec.field(default_factory=HealthConfig)
    timeouts: TimeoutConfig = msgspec.field(default_factory=TimeoutConfig)
    retry: RetryConfig = msgspec.field(default_factory=RetryConfig)
    breaker: BreakerConfig = msgspec.field(default_factory=BreakerConfig)
    admission: AdmissionConfig = msgspec.field(default_factory=AdmissionConfig)
    learn: LearnConfig = msgspec.field(default_factory=LearnConfig)
    client: ClientConfig = msgspec.field(default_factory=ClientConfig)
    limits: LimitsConfig = msgspec.field(default_factory=LimitsConfig)

    def __post_init__(self) -> None:
        labels = [b.label for b in self.backends]
        if len(set(labels)) != len(labels):
            raise ValueError("backend names must be unique")


_LIST_FIELDS = {"backends", "api_keys"}


def _read_file(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except OSError as exc:
        raise ConfigError(f"cannot read config file {str(path)!r}: {exc.strerror}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {str(path)!r} is not valid TOML: {exc}") from exc


def _struct_fields(struct: type[msgspec.Struct]) -> dict[str, Any]:
    return {f.name: f.type for f in msgspec.structs.fields(struct)}


def _env_path(name: str) -> list[str] | None:
    """`SPECROUTE_TIMEOUTS__IDLE_S` -> ["timeouts", "idle_s"] if Config has that field."""
    parts = name[len(ENV_PREFIX) :].lower().split("__")
    struct: Any = Config
    for i, part in enumerate(parts):
        fields = _struct_fields(struct)
        if part not in fields:
            return None
        kind = fields[part]
        is_section = isinstance(kind, type) and issubclass(kind, _Section)
        if i < len(parts) - 1 and not is_section:
            return None
        struct = kind
    return parts


def _env_value(field: str, value: str) -> object:
    if field == "backends":
        return [{"url": url.strip()} for url in value.split(",") if url.strip()]
    if field in _LIST_FIELDS:
        return [item.strip() for item in value.split(",") if item.strip()]
    return value


def _apply_env(data: dict[str, Any], environ: Mapping[str, str]) -> None:
    for name, value in sorted(environ.items()):
        if not name.startswith(ENV_PREFIX):
            continue
        path = _env_path(name)
        if path is None:
            continue  # other SPECROUTE_* variables belong to other commands
        target = data
        for part in path[:-1]:
            target = target.setdefault(part, {})
        target[path[-1]] = _env_value(path[-1], value)


def _normalise_backends(data: dict[str, Any]) -> None:
    backends = data.get("backends")
    if isinstance(backends, list):
        data["backends"] = [{"url": b} if isinstance(b, str) else b for b in backends]


def load_config(
    path: str | Path | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, object] | None = None,
) -> Config:
    """Merge file, environment and flag overrides (later wins) into a validated `Config`;
    `environ` defaults to the process environment (`{}` reads none)."""
    data: dict[str, Any] = _read_file(Path(path)) if path is not None else {}
    _normalise_backends(data)
    _apply_env(data, os.environ if environ is None else environ)
    data.update({k: v for k, v in (overrides or {}).items() if v is not None})
    _normalise_backends(data)
    try:
        return msgspec.convert(data, Config, strict=False)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"invalid configuration: {exc}") from exc
