"""A request's tokens as vLLM's OpenAI server writes them (the same tokens per iteration as the
SGLang dialect: one chunk per engine step, holding every token that step accepted).

The shapes follow vllm/entrypoints/openai/chat_completion/serving.py and
completion/serving.py: a chat stream opens with a role-only chunk, each step's tokens are one
chunk, the finish reason rides on the last content chunk (no finish chunk of its own), and with
`stream_options.include_usage` one last chunk carries `usage` and no choices; bodies have no
`sglext`, `matched_stop` or `metadata`, but vLLM's `stop_reason`. With
`--per-request-spec-decode-metrics`, the usage chunk and whole bodies carry `metrics`
(`vllm_request_metrics`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from specroute.emulator.driver import Driver
from specroute.emulator.faults import MALFORMED_EVENT, Faults
from specroute.emulator.streams import DONE_EVENT, Reply, Responder
from specroute.emulator.vllm_request_metrics import SpecMetricsLevel, request_metrics
from specroute.emulator.wire import encode, usage

__all__ = ["VllmResponder"]


class VllmResponder(Responder):
    """Builds every generation response of one emulated vLLM server."""

    def __init__(
        self,
        driver: Driver,
        faults: Faults,
        *,
        speculative: bool,
        spec_metrics: SpecMetricsLevel = "none",
        num_spec_tokens: int = 0,
    ) -> None:
        """`spec_metrics`: `--per-request-spec-decode-metrics`; `num_spec_tokens`: K."""
        super().__init__(driver, faults, speculative=speculative)
        self.spec_metrics: SpecMetricsLevel = spec_metrics
        self.num_spec_tokens = num_spec_tokens

    def _chunk(self, reply: Reply, kind: str, choice: dict[str, Any]) -> bytes:
        body: dict[str, Any] = {**reply.envelope(kind), "choices": [choice]}
        if reply.continuous_usage:
            body["usage"] = usage(reply.job.seq.prompt_tokens, reply.job.taken)
        return b"data: " + encode(body) + b"\n\n"

    def _reason(self, reply: Reply) -> str | None:
        return reply.job.finish_reason if reply.job.done else None

    async def chat_stream(self, reply: Reply) -> AsyncIterator[bytes]:
        kind, first = "chat.completion.chunk", True
        try:
            async for n in self.pieces(reply):
                if n < 0:
                    yield MALFORMED_EVENT
                    continue
                out = b""
                if first:
                    first = False
                    role = {"index": 0, "delta": {"role": "assistant", "content": ""},
                            "logprobs": None, "finish_reason": None}  # fmt: skip
                    out = self._chunk(reply, kind, role)
                reason = self._reason(reply)
                if n or reason is not None:
                    delta = {"content": reply.source.text(n)} if n else {}
                    choice = {"index": 0, "delta": delta, "logprobs": None,
                              "finish_reason": reason}  # fmt: skip
                    if reason is not None:
                        choice["stop_reason"] = None
                    out += self._chunk(reply, kind, choice)
                if out:
                    yield out
            yield self._tail(reply, kind)
        finally:
            self.driver.release(reply.job)

    async def completion_stream(self, reply: Reply) -> AsyncIterator[bytes]:
        kind, prefix = "text_completion", reply.echo
        try:
            async for n in self.pieces(reply):
                if n < 0:
                    yield MALFORMED_EVENT
                    continue
                text, prefix = prefix + reply.source.text(n), ""
                choice = {"index": 0, "text": text, "logprobs": None,
                          "finish_reason": self._reason(reply), "stop_reason": None}  # fmt: skip
                yield self._chunk(reply, kind, choice)
            yield self._tail(reply, kind)
        finally:
            self.driver.release(reply.job)

    def _tail(self, reply: Reply, kind: str) -> bytes:
        """The usage chunk (only when asked), then [DONE]."""
        if not reply.include_usage:
            return DONE_EVENT
        counts = usage(reply.job.seq.prompt_tokens, reply.job.produced)
        body = {**reply.envelope(kind), "choices": [], "usage": counts}
        metrics = request_metrics(
            reply.job.seq, self.spec_metrics, self.num_spec_tokens, stream=True
        )
        if metrics is not None:
            body["metrics"] = metrics
        return b"data: " + encode(body) + b"\n\n" + DONE_EVENT

    def chat_body(self, reply: Reply) -> bytes:
        text = reply.source.text(reply.job.produced)
        message: dict[str, Any] = {"role": "assistant", "content": text, "reasoning_content": None,
                   "tool_calls": []}  # fmt: skip
        choice = {"index": 0, "message": message, "logprobs": None,
                  "finish_reason": reply.job.finish_reason, "stop_reason": None}  # fmt: skip
        return self._body(reply, "chat.completion", choice)

    def completion_body(self, reply: Reply) -> bytes:
        text = reply.echo + reply.source.text(reply.job.produced)
        choice = {"index": 0, "text": text, "logprobs": None,
                  "finish_reason": reply.job.finish_reason, "stop_reason": None}  # fmt: skip
        return self._body(reply, "text_completion", choice)

    def _body(self, reply: Reply, kind: str, choice: dict[str, Any]) -> bytes:
        body: dict[str, Any] = {**reply.envelope(kind), "choices": [choice]}
        body["usage"] = usage(reply.job.seq.prompt_tokens, reply.job.produced)
        body["prompt_logprobs"] = None
        body["metrics"] = request_metrics(
            reply.job.seq, self.spec_metrics, self.num_spec_tokens, stream=False
        )
        return encode(body)
