"""The bench's HTTP client (aiohttp, chosen by `benchmarks/bench_client_throughput.py`) and
the record of one streamed request: every chunk's arrival time and token count.

Times in a record are seconds from its level's origin; latency counts from `scheduled`, the
moment the load generator meant to send, so queueing inside the client is not hidden.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import msgspec

from specroute.bench.backoff import ConnectBackoff
from specroute.bench.timing import estimate_tokens, spread_total, tokens_from_cumulative
from specroute.bench.workload import PreparedRequest
from specroute.sse import DONE, SSEDecoder

if TYPE_CHECKING:
    import aiohttp

__all__ = ["BenchClient", "RequestRecord"]

_NO_AIOHTTP = "the bench's HTTP client needs aiohttp: pip install 'specroute[bench]'"
_KEEPALIVE_S = 4.0
"""How long an idle pooled connection is kept: under the 5 s after which the servers close one
(uvicorn's `timeout_keep_alive` default, which the proxy keeps; vLLM's
`VLLM_HTTP_TIMEOUT_KEEP_ALIVE` in `vllm/envs.py`), so a user never reuses a connection the
server is closing (aiohttp's 15 s default did: "Can not write request body" on the first
request of a phase, after the users of the last one left)."""


class RequestRecord(msgspec.Struct, kw_only=True):
    """One request as the client saw it; tokens per chunk are exact when `token_source` is
    `continuous`, spread from the final usage when `final`, estimated from text when `text`."""

    index: int
    klass: str = "default"
    greedy: bool = True
    scheduled: float
    sent: float = 0.0
    first_token: float | None = None
    finished: float = 0.0
    status: int = 0
    error: str | None = None
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    token_source: str = "text"
    chunk_times: list[float] = msgspec.field(default_factory=list)
    chunk_tokens: list[int] = msgspec.field(default_factory=list)
    spec_verify_ct: int | None = None
    spec_accept_length: float | None = None
    spec_accepted_drafts: int | None = None
    """Draft tokens accepted over `spec_verify_ct` verifies: vLLM's per-request figure."""
    phase: str = ""
    backend: str = ""
    """The backend a specroute proxy sent it to (`x-specroute-backend`), if it said."""

    @property
    def ok(self) -> bool:
        return self.error is None and self.completion_tokens > 0

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.scheduled

    @property
    def e2e(self) -> float:
        return self.finished - self.scheduled

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first (SGLang bench_serving's TPOT)."""
        ttft = self.ttft
        if ttft is None or self.completion_tokens < 2:
            return None
        return (self.e2e - ttft) / (self.completion_tokens - 1)


class _Usage(msgspec.Struct):
    """Chat's usage, or the Responses and Messages APIs' (`input_tokens`, `output_tokens`)."""

    completion_tokens: int = 0
    prompt_tokens: int = 0
    input_tokens: int | None = None
    output_tokens: int | None = None

    def normal(self) -> _Usage:
        """In chat's fields."""
        if self.input_tokens is None and self.output_tokens is None:
            return self
        return _Usage(
            completion_tokens=self.output_tokens or 0, prompt_tokens=self.input_tokens or 0
        )


class _Delta(msgspec.Struct):
    content: str | None = None
    reasoning_content: str | None = None


class _Choice(msgspec.Struct):
    delta: _Delta | None = None
    text: str | None = None
    finish_reason: str | None = None


class _Details(msgspec.Struct):
    spec_verify_ct: int | None = None
    spec_accept_length: float | None = None


class _Sglext(msgspec.Struct):
    spec_tokens_details: _Details | None = None


class _SpecDecoding(msgspec.Struct):
    """vLLM's `metrics.speculative_decoding` (`--per-request-spec-decode-metrics`; in streams on
    the usage chunk; vllm/entrypoints/generate/base/protocol.py)."""

    num_spec_steps: int = 0
    num_accepted_draft_tokens: int = 0
    mean_acceptance_length: float | None = None


class _Metrics(msgspec.Struct):
    speculative_decoding: _SpecDecoding | None = None


class _TextDelta(msgspec.Struct):
    text: str | None = None


class _Whole(msgspec.Struct):
    usage: _Usage | None = None


class _Chunk(msgspec.Struct):
    """A chat or completions chunk, or a Responses or Messages event (`type`, `delta`)."""

    choices: list[_Choice] = []
    usage: _Usage | None = None
    sglext: _Sglext | None = None
    metrics: _Metrics | None = None
    error: Any = None
    type: str = ""
    delta: str | _TextDelta | None = None
    response: _Whole | None = None
    message: _Whole | None = None


_decode_chunk = msgspec.json.Decoder(_Chunk).decode
_TEXT_EVENTS = frozenset({"response.output_text.delta", "content_block_delta"})


class _StreamState:
    """Accumulates one stream's chunks; `finish` turns them into token-exact chunk records."""

    __slots__ = ("continuous", "cumulative", "final_usage", "texts", "times")

    def __init__(self) -> None:
        self.times: list[float] = []
        self.texts: list[str] = []
        self.cumulative: list[int] = []
        self.continuous = True
        self.final_usage: _Usage | None = None

    def add(self, chunk: _Chunk, at: float, record: RequestRecord) -> None:
        if chunk.type:
            self._add_event(chunk, at)
            return
        text = ""
        for choice in chunk.choices:
            if choice.delta is not None:
                text += (choice.delta.content or "") + (choice.delta.reasoning_content or "")
            elif choice.text:
                text += choice.text
            if choice.finish_reason:
                record.finish_reason = choice.finish_reason
        if chunk.usage is not None:
            self.final_usage = chunk.usage
        if chunk.sglext is not None and chunk.sglext.spec_tokens_details is not None:
            record.spec_verify_ct = chunk.sglext.spec_tokens_details.spec_verify_ct
            record.spec_accept_length = chunk.sglext.spec_tokens_details.spec_accept_length
        spec = chunk.metrics.speculative_decoding if chunk.metrics else None
        if spec is not None and spec.num_spec_steps:
            record.spec_verify_ct = spec.num_spec_steps
            record.spec_accepted_drafts = spec.num_accepted_draft_tokens
            record.spec_accept_length = spec.mean_acceptance_length
        grew = chunk.usage is not None and chunk.usage.completion_tokens > (
            self.cumulative[-1] if self.cumulative else 0
        )
        if not text and not grew:
            return
        if chunk.usage is None or not chunk.choices:
            self.continuous = False
        self.times.append(at)
        self.texts.append(text)  # estimated only if the server gives no usage: saves CPU
        self.cumulative.append(chunk.usage.completion_tokens if chunk.usage else 0)

    def _add_event(self, event: _Chunk, at: float) -> None:
        """A Responses or Messages event: text deltas are chunks, usage comes at the end."""
        whole = event.response or event.message
        usage = whole.usage if whole is not None and whole.usage is not None else event.usage
        if usage is not None:
            usage = usage.normal()
            last = self.final_usage
            self.final_usage = _Usage(
                completion_tokens=usage.completion_tokens
                or (last.completion_tokens if last else 0),
                prompt_tokens=usage.prompt_tokens or (last.prompt_tokens if last else 0),
            )
        delta = event.delta
        text = delta if isinstance(delta, str) else (delta.text if delta is not None else None)
        if text and event.type in _TEXT_EVENTS:
            self.continuous = False
            self.times.append(at)
            self.texts.append(text)
            self.cumulative.append(0)

    def finish(self, record: RequestRecord) -> None:
        if self.final_usage is not None:
            record.prompt_tokens = self.final_usage.prompt_tokens
        if self.continuous and self.cumulative:
            tokens, source = tokens_from_cumulative(self.cumulative), "continuous"
        elif self.final_usage is not None and self.final_usage.completion_tokens > 0:
            weights = [estimate_tokens(t) for t in self.texts]
            tokens = spread_total(weights, self.final_usage.completion_tokens)
            source = "final"
        else:
            tokens, source = [estimate_tokens(t) for t in self.texts], "text"
        record.chunk_times = [t for t, n in zip(self.times, tokens, strict=True) if n > 0]
        record.chunk_tokens = [n for n in tokens if n > 0]
        record.completion_tokens = sum(record.chunk_tokens)
        record.token_source = source
        record.first_token = record.chunk_times[0] if record.chunk_times else None


class BenchClient:
    """One long-lived connection pool sized for the bench's concurrency; use `async with`."""

    def __init__(self, *, connections: int, api_key: str | None = None, timeout: float = 600.0):
        try:
            import aiohttp
        except ModuleNotFoundError as exc:  # an optional extra: the proxy does not need it
            raise ModuleNotFoundError(_NO_AIOHTTP, name="aiohttp") from exc
        self._errors: tuple[type[Exception], ...] = (aiohttp.ClientError, TimeoutError)
        self._stream_errors = (*self._errors, msgspec.DecodeError)
        self._connections = max(1, connections)
        self._headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._timeout = aiohttp.ClientTimeout(total=timeout, sock_connect=30)
        self._session: aiohttp.ClientSession | None = None
        self.chunks = 0
        """Every SSE event received by this client (for its self-measurement)."""
        self._backoffs: dict[str, ConnectBackoff] = {}

    async def __aenter__(self) -> BenchClient:
        import aiohttp

        connector = aiohttp.TCPConnector(
            limit=self._connections,
            limit_per_host=0,
            ttl_dns_cache=300,
            force_close=False,
            keepalive_timeout=_KEEPALIVE_S,
        )
        self._session = aiohttp.ClientSession(
            connector=connector, timeout=self._timeout, headers=self._headers
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("BenchClient used outside `async with`")
        return self._session

    def backoff(self, base_url: str) -> ConnectBackoff:
        """The closed-loop users' backoff for one target, kept across its levels."""
        return self._backoffs.setdefault(base_url, ConnectBackoff())

    async def get(self, url: str) -> bytes | None:
        """The body of a GET, or None when the server does not answer 200."""
        try:
            async with self.session.get(url) as response:
                return await response.read() if response.status == 200 else None
        except self._errors:
            return None

    async def stream(
        self, base_url: str, request: PreparedRequest, record: RequestRecord, origin: float
    ) -> RequestRecord:
        """Send one streaming request and fill `record` as its chunks arrive."""
        clock = time.perf_counter
        state = _StreamState()
        decoder = SSEDecoder()
        record.sent = clock() - origin
        try:
            async with self.session.post(base_url + request.path, data=request.body) as response:
                record.status = response.status
                record.backend = response.headers.get("x-specroute-backend", "")
                if not 200 <= response.status < 300:
                    body = await response.read()
                    record.error = f"HTTP {response.status}: {body[:200].decode(errors='replace')}"
                    return record
                async for data in response.content.iter_any():
                    at = clock() - origin
                    for payload in decoder.feed(data):
                        self.chunks += 1
                        if payload == DONE:
                            continue
                        chunk = _decode_chunk(payload)
                        if chunk.error is not None:
                            record.error = (
                                f"stream error: {msgspec.json.encode(chunk.error)[:200]!r}"
                            )
                        state.add(chunk, at, record)
        except self._stream_errors as exc:
            record.error = f"{type(exc).__name__}: {exc}"
        finally:
            record.finished = clock() - origin
            state.finish(record)
        return record
