"""Typed configuration for `specroute serve`: a TOML file, then `SPECROUTE_*` variables, then flags.

Every section is a frozen msgspec Struct that rejects unknown fields, so a typo fails at start-up
with a message naming its path (`$.backends[1].url`). Nested fields are reachable from the
environment with double underscores: `SPECROUTE_TIMEOUTS__IDLE_S=30`; a `SPECROUTE_*` name that
is no setting is refused the same way, naming the closest one. A field's docstring (the string
below it) is its documentation: `specroute config example` writes it into the example file.
"""

from __future__ import annotations

import difflib
import os
import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import msgspec

from specroute.errors import ConfigError
from specroute.lanes import LanesConfig
from specroute.structdoc import misspelt_hint

__all__ = [
    "AdmissionConfig",
    "BackendConfig",
    "BreakerConfig",
    "ClientConfig",
    "Config",
    "HealthConfig",
    "LanesConfig",
    "LearnConfig",
    "LimitsConfig",
    "MigrationConfig",
    "PriorConfig",
    "ReplicasConfig",
    "RetryConfig",
    "TimeoutConfig",
    "env_names",
    "load_config",
    "parse_backend",
]

ENV_PREFIX = "SPECROUTE_"
Positive = Annotated[float, msgspec.Meta(gt=0)]
NonNegative = Annotated[float, msgspec.Meta(ge=0)]
Count = Annotated[int, msgspec.Meta(ge=1)]
MIN_INTERVAL_S = 0.05
Interval = Annotated[float, msgspec.Meta(ge=MIN_INTERVAL_S)]
"""A period something repeats at (a probe, a scrape, a heartbeat, a lookup): at least 50 ms,
so that a typo (`1e-9`) cannot make a background loop spin a core."""
Port = Annotated[int, msgspec.Meta(ge=0, le=65535)]

NON_CONFIG_VARIABLES = frozenset({"SPECROUTE_TEST_QUIET", "SPECROUTE_DASHBOARD_SCREENSHOT"})
"""`SPECROUTE_*` names that tests and tools read for their own purposes: not settings, and not
refused as misspelt ones (tests/servers.py, tests/test_dashboard_browser.py and the Makefile)."""


def check_url(url: str, what: str) -> None:
    """ValueError unless `url` is an http(s) URL with a host and, if given, a valid port: what
    the pool's client will connect to, checked now rather than at the first request."""
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"{what} url {url!r} must start with http:// or https://")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  # parsed on access: "h:abc" and "h:99999" raise here
    except ValueError as exc:
        raise ValueError(f"{what} url {url!r} is not a valid URL: {exc}") from None
    if not parts.hostname:
        raise ValueError(f"{what} url {url!r} names no host")
    if parts.query or parts.fragment:
        raise ValueError(f"{what} url {url!r} must not have a query or fragment")


class _Section(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    pass


class BackendConfig(_Section, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One SGLang or vLLM server. `max_in_flight` overrides the limit derived from its capacity.

    With `resolve_every_s`, the url's host is a DNS name (a Kubernetes headless Service):
    every address it resolves to is a backend, and the name is resolved again on that interval.
    """

    url: str
    """The server's base URL (`http://host:port`), without `/v1`."""
    name: Annotated[str, msgspec.Meta(examples=["steps3"])] | None = None
    """The name in headers, logs, metrics and `/pool`; unset: host:port."""
    api_key: Annotated[str, msgspec.Meta(examples=["sglang-key"])] | None = None
    """Sent to the server as `Authorization: Bearer` (SGLang's `--api-key`)."""
    max_in_flight: Annotated[int, msgspec.Meta(ge=1, examples=[34])] | None = None
    """Requests the proxy sends it at once; unset: `overcommit` x its max_running_requests."""
    resolve_every_s: Annotated[float, msgspec.Meta(ge=MIN_INTERVAL_S, examples=[15.0])] | None = (
        None
    )
    """Resolve the url's host again this often; every address it gives is a backend."""
    engine: Literal["auto", "sglang", "vllm"] = "auto"
    """The server's engine; "auto": SGLang if /server_info says so, vLLM if /metrics does."""
    steps: Annotated[int, msgspec.Meta(ge=0, le=16, examples=[3])] | None = None
    """Its depth where the engine does not report it (vLLM's `num_speculative_tokens`)."""
    capacity: Annotated[int, msgspec.Meta(ge=1, examples=[256])] | None = None
    """Its batch limit where the engine does not report it (vLLM's `--max-num-seqs`)."""

    def __post_init__(self) -> None:
        check_url(self.url, "backend")

    @property
    def label(self) -> str:
        """The name used in headers, logs and metrics: `name`, else host:port."""
        return self.name or self.url.split("://", 1)[1].rstrip("/")


class HealthConfig(_Section, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Polling of /ready (never /health: it runs a generation), /server_info and /metrics."""

    interval_s: Interval = 2.0
    """Seconds between two /ready checks of a backend."""
    timeout_s: Positive = 2.0
    """A check that takes longer fails."""
    failure_threshold: Count = 2
    """Failed checks in a row that take a healthy backend out of routing."""
    success_threshold: Count = 2
    """Passed checks in a row that bring it back."""
    discovery_interval_s: Interval = 60.0
    """Seconds between /server_info reads (depth, capacity, model) of a healthy backend."""
    metrics_interval_s: Interval = 5.0
    """Seconds between /metrics scrapes (running and queued requests, acceptance)."""


class TimeoutConfig(_Section, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Every wait on a backend has a limit that fits the request from its first try.

    A stream's headers must come within `header_s` (SGLang sends them before it queues or
    prefills). Its first token within the predicted prefill of its prompt (and the predicted
    queue wait when the backend is full) times `margin`, plus `first_token_floor_s`. Its
    events (complete SSE events, not bytes) at most `stall_floor_s` apart until the backend's
    own gaps are learned. A non-streamed reply (its headers come with its end) must be whole
    within its first-token limit plus `max_tokens` predicted iterations times `margin`. Once
    16 samples are in, the limits also allow `stall_factor` times the p99 of that backend's
    own quiet times; nothing waits past `first_byte_s`, `idle_s` or `reply_s`. A stream quiet
    for `heartbeat_s` gets an SSE comment, so its client can tell slow from dead."""

    connect_s: Positive = 5.0
    """Time to open a connection to a backend."""
    header_s: Positive = 5.0
    """Time from sending a streamed request to its reply's headers."""
    first_byte_s: Positive = 900.0
    """The longest wait for a stream's first token, however long its prompt or its queue."""
    idle_s: Positive = 120.0
    """The longest silence inside a stream, however slow its backend has been."""
    reply_s: Positive = 3600.0
    """The longest a non-streamed reply may take, however large its `max_tokens`; a request
    moved to another backend (`migration`) gets what is left of it."""
    heartbeat_s: Interval = 5.0
    """A stream quiet this long gets an SSE comment (`: keep-alive`), and then again."""
    margin: Annotated[float, msgspec.Meta(ge=1)] = 4.0
    """A priori limits: this many times the predicted prefill, queue wait and decode."""
    assumed_max_tokens: Count = 8192
    """Tokens a non-streamed request without `max_tokens` is allowed the time for."""
    stall_factor: Annotated[float, msgspec.Meta(ge=1)] = 20.0
    """Learned limits: this many times the p99 of the backend's own quiet times."""
    stall_floor_s: Positive = 5.0
    """The shortest gap between events that counts as a stall (at most `idle_s`)."""
    first_token_floor_s: Positive = 5.0
    """Added to the predicted wait for a first token (at most `first_byte_s`)."""


class RetryConfig(_Section, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Attempts (first try included) for failures before the first byte reaches the client."""

    max_attempts: Count = 3
    """Backends one request may be tried on, the first included."""
    backoff_s: NonNegative = 0.05
    """Wait before the second attempt; doubled for each one after."""
    backoff_max_s: NonNegative = 1.0
    """The longest wait between two attempts."""


class MigrationConfig(_Section, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Chat, completions and `/generate` requests that move to another backend when theirs
    fails or drains mid-way: a stream's text so far is continued there, into the same client
    stream; a non-streamed request, of which the client has seen nothing, is sent again."""

    max_moves: Annotated[int, msgspec.Meta(ge=0)] = 1
    """Times one request may move when its backend fails mid-way; 0 turns migration off (a
    non-streamed request is then retried from the start under `retry.max_attempts`)."""
    drain_s: NonNegative = 2.0
    """Seconds a draining backend's requests may run on before they move to another backend
    (the launcher's `--drain` stays the limit for streams that cannot move)."""


class BreakerConfig(_Section, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Consecutive failures that open a backend's circuit, and how long it stays open."""

    failure_threshold: Count = 5
    """Failed requests in a row that open a backend's circuit (no requests sent to it)."""
    open_s: Positive = 10.0
    """Seconds the circuit stays open before one trial request."""


class AdmissionConfig(_Section, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The proxy's wait queue for when every backend is at its in-flight limit.

    A backend's limit is `max_in_flight`, else `overcommit` times its `max_running_requests`
    (SGLang queues the surplus itself), else unlimited when its capacity is unknown.
    """

    queue_size: Annotated[int, msgspec.Meta(ge=0)] = 1024
    """Requests that may wait in the proxy; one more is answered 429."""
    queue_timeout_s: Positive = 30.0
    """How long one may wait for a free backend before a 503."""
    overcommit: Annotated[float, msgspec.Meta(ge=1)] = 2.0
    """A backend's in-flight limit as a multiple of its max_running_requests."""
    retry_after_s: Positive = 1.0
    """The `Retry-After` sent with a 429 or 503."""


class LearnConfig(_Section, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What the proxy adds upstream to learn from replies; it strips the extras from the reply."""

    include_usage: bool = True
    """Ask for `stream_options.include_usage` (exact token counts per stream)."""
    spec_tokens_details: bool = True
    """Ask for `return_spec_tokens_details` (exact acceptance per request)."""


class ClientConfig(_Section, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The upstream HTTP client (specroute's own HTTP/1.1 on asyncio protocols: on the proxied
    path it measured fastest, see `pool/h1.py`); `max_connections` bounds its pool."""

    max_connections: Count = 1024
    """Upstream connections open at once, all backends together."""


class LimitsConfig(_Section, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What one client may ask of the proxy: header size and count, time to send its request
    (headers from the connection's opening or the request's first byte, body from the end of
    the headers), open connections (in all, per peer address, and `reserved_connections` that
    only clients with a valid API key may hold: 1/16 of them unless set), how long it may leave
    a stream unread (`client_stall_s`: then the stream ends and its backend is freed); and how
    long streams run on after SIGTERM. Request bodies held at once, all requests together, are
    capped at `max_body_bytes_in_flight`: past it a request waits up to `body_wait_s`, then 503.
    What a backend sends back is capped too: one SSE event, and a non-streamed reply."""

    max_header_bytes: Count = 64 * 1024
    """A request's headers, in bytes; past it, 431."""
    max_headers: Count = 100
    """Header lines in one request; past it, 431."""
    header_timeout_s: Positive = 10.0
    """Time to send the headers, from the connection's opening or the request's first byte."""
    body_timeout_s: Positive = 60.0
    """Time to send the body, from the end of the headers, on every route; past it, 408."""
    client_stall_s: Interval = 60.0
    """How long a client may leave a stream unread before it is ended and its backend freed."""
    max_connections: Count = 4096
    """Client connections open at once."""
    reserved_connections: Annotated[int, msgspec.Meta(ge=0, examples=[256])] | None = None
    """Of those, the ones only clients with a valid API key may hold; unset: 1/16."""
    max_connections_per_peer: Annotated[int, msgspec.Meta(ge=1, examples=[256])] | None = None
    """Connections per client address; leave unset behind a load balancer."""
    shutdown_grace_s: NonNegative = 30.0
    """How long streams in flight may run on after SIGTERM."""
    max_body_bytes_in_flight: Count = 64 * 1024 * 1024
    """Request-body bytes held at once, all requests together (at least `max_body_bytes`)."""
    body_wait_s: NonNegative = 1.0
    """How long a request waits for room under that cap before a 503 with `Retry-After`."""
    max_event_bytes: Count = 16 * 1024 * 1024
    """One SSE event from a backend, in bytes; past it the stream ends with an error."""
    max_reply_bytes: Count = 128 * 1024 * 1024
    """A non-streamed reply from a backend, held whole to be measured; past it, 502."""
    max_pipelined: Count = 16
    """Requests one connection may send ahead of the answers (HTTP/1.1 pipelining); past it
    the connection is closed."""
    keyless_in_progress: Count = 64
    """With API keys: requests without a valid key in progress at once (public routes and
    refusals alike; /health and /ready not counted); past it, 503 at once."""
    metrics_render_s: Annotated[float, msgspec.Meta(ge=0, le=60)] = 0.5
    """The proxy's `/metrics` is rendered at most once per this many seconds: a request sooner
    waits for the next rendering (so it counts all that came before it); 0: on every request."""

    def __post_init__(self) -> None:
        if self.reserve >= self.max_connections:
            raise ValueError("reserved_connections must be less than max_connections")

    @property
    def reserve(self) -> int:
        """Connections only keyed clients may hold (when API keys are configured)."""
        given = self.reserved_connections
        return self.max_connections // 16 if given is None else given


class ReplicasConfig(_Section, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Several proxies in front of one pool: where the other replicas are (their own estimates
    are read and blended by weight, and the backends' free room is split with them), and how
    often each backend's /metrics is scraped for the load the others add."""

    peers: Annotated[
        tuple[str, ...], msgspec.Meta(examples=[("http://specroute-peers:8000",)])
    ] = ()
    """Urls whose host names every replica (a headless Service, this replica included)."""
    resolve_every_s: Interval = 10.0
    """How often the peers' names are resolved again."""
    read_every_s: Interval = 5.0
    """How often each peer's `GET /pool/estimates` is read."""
    peer_stale_s: Positive = 30.0
    """A peer that has not answered for this long leaves the blend."""
    api_key: Annotated[str, msgspec.Meta(examples=["sk-peer-key"])] | None = None
    """The key sent to peers (one of their `api_keys`); unset: this replica's first key."""
    scrape_min_interval_s: Interval = 0.25
    """The shortest wait between two scrapes of a backend with little room left."""
    scrape_budget_per_s: Positive = 50.0
    """Scrapes per second, all backends together; idle backends wait `metrics_interval_s`."""
    scrape_stale_s: Positive = 15.0
    """A scrape older than this ages out (at least twice `metrics_interval_s` is used)."""
    gauge_lag_s: NonNegative = 0.5
    """How far behind a backend's running and queued gauges may be (at least 40 iterations)."""
    split: Literal["capacity", "room"] = "capacity"
    """What replicas split by rank: each backend's `capacity` (never over it together; a
    replica with more requests than its share holds them) or the `room` free at each scrape
    (fuller use; a slot can be taken twice when the gauges miss a replica's newest requests)."""

    def __post_init__(self) -> None:
        for url in self.peers:
            check_url(url, "peer")


class PriorConfig(_Section, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A profile the pool starts from (`specroute tune` writes one as `prior.json`, `specroute
    bench profile` one from a sweep): iteration times per depth and acceptance per sampling
    class, so the first requests route as well as after warm-up. Read once at start-up; a file
    that cannot be read or has another format version stops the start with status 2."""

    path: Annotated[str, msgspec.Meta(examples=["specroute-tune/prior.json"])] | None = None
    """The profile file; unset: built-in defaults until the pool has learned from requests."""


class Config(_Section, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Everything `specroute serve` needs."""

    backends: tuple[BackendConfig, ...] = ()
    """The SGLang servers (`[[backends]]` tables, or URLs, or `NAME=URL` strings)."""
    host: str = "127.0.0.1"
    """The address to listen on; 0.0.0.0 for every interface."""
    port: Port = 8000
    """The port to listen on."""
    policy: str = "throughput"
    """The routing policy, `name` or `name:key=value,...` (`specroute policies`)."""
    api_keys: tuple[str, ...] = ()
    """Client keys accepted as `Authorization: Bearer KEY`; empty: no auth."""
    admin_key: Annotated[str, msgspec.Meta(examples=["change-me"])] | None = None
    """The key for PUT /policy; unset: the policy cannot be switched at run time."""
    class_keys: tuple[str, ...] = ()
    """API keys whose requests may name their workload class (`x-specroute-class`); the admin
    key may too. Without `api_keys`, every request may."""
    max_body_bytes: Count = 32 * 1024 * 1024
    """The largest request body; past it, 413."""
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    """The lowest level logged."""
    request_log_share: Annotated[float, msgspec.Meta(ge=0.0, le=1.0)] = 1.0
    """The share of successful requests logged as `request_finished` (about 550 bytes of JSON
    each), evenly spaced; failed ones always are. 0.01 turns 1.7 GB a day at 35 requests/s
    into 17 MB."""
    health: HealthConfig = msgspec.field(default_factory=HealthConfig)
    timeouts: TimeoutConfig = msgspec.field(default_factory=TimeoutConfig)
    retry: RetryConfig = msgspec.field(default_factory=RetryConfig)
    migration: MigrationConfig = msgspec.field(default_factory=MigrationConfig)
    breaker: BreakerConfig = msgspec.field(default_factory=BreakerConfig)
    admission: AdmissionConfig = msgspec.field(default_factory=AdmissionConfig)
    learn: LearnConfig = msgspec.field(default_factory=LearnConfig)
    client: ClientConfig = msgspec.field(default_factory=ClientConfig)
    limits: LimitsConfig = msgspec.field(default_factory=LimitsConfig)
    replicas: ReplicasConfig = msgspec.field(default_factory=ReplicasConfig)
    prior: PriorConfig = msgspec.field(default_factory=PriorConfig)
    lanes: LanesConfig = msgspec.field(default_factory=LanesConfig)

    def __post_init__(self) -> None:
        for field in ("api_keys", "class_keys"):
            for i, key in enumerate(getattr(self, field)):
                if not key.strip():
                    raise ValueError(f"{field}[{i}] is blank: a key must have characters")
        labels = [b.label for b in self.backends]
        if len(set(labels)) != len(labels):
            raise ValueError("backend names must be unique")
        if not set(self.class_keys) <= {*self.api_keys, self.admin_key}:
            raise ValueError("class_keys must be listed in api_keys")
        lane_keys = {*self.lanes.interactive_keys, *self.lanes.batch_keys}
        if not lane_keys <= {*self.api_keys, self.admin_key}:
            raise ValueError("lanes.interactive_keys and lanes.batch_keys must be in api_keys")
        if self.limits.max_body_bytes_in_flight < self.max_body_bytes:
            raise ValueError("limits.max_body_bytes_in_flight must be at least max_body_bytes")


_LIST_FIELDS = {"backends", "api_keys", "class_keys", "peers", "interactive_keys", "batch_keys"}
_KEY_FIELDS = {"api_keys", "class_keys", "interactive_keys", "batch_keys"}


def _read_file(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except OSError as exc:
        raise ConfigError(f"cannot read config file {str(path)!r}: {exc.strerror}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {str(path)!r} is not valid TOML: {exc}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file {str(path)!r} is not UTF-8 text: {exc}") from exc
    except RecursionError as exc:
        raise ConfigError(f"config file {str(path)!r} nests tables or arrays too deeply") from exc


def _struct_fields(struct: type[msgspec.Struct]) -> dict[str, Any]:
    return {f.name: f.type for f in msgspec.structs.fields(struct)}


def _env_leaves(struct: Any, prefix: str) -> Iterator[str]:
    for name, kind in _struct_fields(struct).items():
        if isinstance(kind, type) and issubclass(kind, _Section | LanesConfig):
            yield from _env_leaves(kind, f"{prefix}{name.upper()}__")
        else:
            yield prefix + name.upper()


def env_names() -> list[str]:
    """Every `SPECROUTE_*` variable that sets something: `SPECROUTE_PORT`, ..."""
    return sorted(_env_leaves(Config, ENV_PREFIX))


def _unknown_variable(name: str) -> ConfigError:
    close = difflib.get_close_matches(name, env_names(), n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]}?" if close else "; `specroute config example` lists them"
    return ConfigError(f"invalid configuration: environment variable {name} is not a setting{hint}")


def _env_path(name: str) -> list[str] | None:
    """`SPECROUTE_TIMEOUTS__IDLE_S` -> ["timeouts", "idle_s"] if that is a setting."""
    if name.upper() not in env_names():
        return None
    return name[len(ENV_PREFIX) :].lower().split("__")


def parse_backend(given: str) -> dict[str, str]:
    """`steps3=http://host:30000` names the backend; a bare URL is named host:port."""
    given = given.strip()
    name, sep, url = given.partition("=")
    if sep and "://" not in name:
        return {"name": name.strip(), "url": url.strip()}
    return {"url": given}


def _env_value(name: str, field: str, value: str) -> object:
    if field == "backends":
        return [parse_backend(item) for item in value.split(",") if item.strip()]
    if field in _LIST_FIELDS:
        items = [item.strip() for item in value.split(",") if item.strip()]
        if not items and field in _KEY_FIELDS:
            # A key list set to blanks is a mistake, not a wish for an open proxy: fail closed.
            raise ConfigError(
                f"invalid configuration: {name} is set but lists no key; "
                "unset it to run without API keys"
            )
        return items
    return value


def _apply_env(data: dict[str, Any], environ: Mapping[str, str]) -> None:
    for name, value in sorted(environ.items()):
        if not name.startswith(ENV_PREFIX):
            continue
        if name in NON_CONFIG_VARIABLES:
            continue
        path = _env_path(name)
        if path is None:
            raise _unknown_variable(name)
        target = data
        for part in path[:-1]:
            target = target.setdefault(part, {})
        target[path[-1]] = _env_value(name, path[-1], value)


def _normalise_backends(data: dict[str, Any]) -> None:
    backends = data.get("backends")
    if isinstance(backends, list):
        data["backends"] = [parse_backend(b) if isinstance(b, str) else b for b in backends]


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
        hint = misspelt_hint(str(exc), Config, "; `specroute config example` lists them")
        raise ConfigError(f"invalid configuration: {exc}{hint}") from exc
    except RecursionError as exc:  # a value nested past any setting's depth
        raise ConfigError("invalid configuration: a value is nested too deeply") from exc
