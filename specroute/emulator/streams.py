"""A request's tokens as SGLang writes them: SSE chunks while streaming, one JSON object if not.

Hot paths (one content chunk per request per iteration) splice prebuilt byte prefixes around
the msgspec-encoded text; once-per-request objects go through `wire.encode`. Each stream
releases its engine request in `finally`, so a client that goes away aborts it at once.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from specroute.emulator.driver import Driver, Job
from specroute.emulator.faults import MALFORMED_EVENT, Faults
from specroute.emulator.text import EOS_TOKEN_ID, StopMatch, TextSource
from specroute.emulator.wire import encode, finish_reason_json, spec_details, usage

__all__ = ["DONE_EVENT", "Reply", "Responder"]

DONE_EVENT = b"data: [DONE]\n\n"
_NULL_TAIL = b',"logprobs":null,"finish_reason":null,"matched_stop":null}]'


class Reply:
    """What one generation request needs to be answered."""

    __slots__ = (
        "continuous_usage",
        "created",
        "echo",
        "include_usage",
        "job",
        "malformed",
        "model",
        "rid",
        "source",
        "stop",
        "want_spec",
    )

    def __init__(
        self,
        job: Job,
        source: TextSource,
        *,
        model: str,
        created: int,
        include_usage: bool = False,
        continuous_usage: bool = False,
        want_spec: bool = False,
        echo: str = "",
        malformed: bool = False,
        stop: StopMatch | None = None,
    ) -> None:
        self.job = job
        self.rid = job.rid
        self.source = source
        self.model = model
        self.created = created
        self.include_usage = include_usage
        self.continuous_usage = continuous_usage
        self.want_spec = want_spec
        self.echo = echo
        self.malformed = malformed
        self.stop = stop

    def envelope(self, kind: str) -> dict[str, Any]:
        return {"id": self.rid, "object": kind, "created": self.created, "model": self.model}

    def finish(self) -> tuple[str | None, int | str | None]:
        """(finish_reason, matched_stop) as the OpenAI routes report them: the stop string
        when one ended the request, else EOS's token id."""
        reason = self.job.finish_reason
        if reason != "stop":
            return reason, None
        if self.stop is not None and self.job.produced >= self.stop.tokens:
            return reason, self.stop.matched
        return reason, EOS_TOKEN_ID


class Responder:
    """Builds every generation response of one server."""

    def __init__(self, driver: Driver, faults: Faults, *, speculative: bool) -> None:
        self.driver = driver
        self.faults = faults
        self.speculative = speculative

    def meta_info(self, job: Job) -> dict[str, Any]:
        """SGLang's `meta_info`: e2e latency and the `spec_*` statistics once finished."""
        seq = job.seq
        meta: dict[str, Any] = {
            "id": job.rid,
            "finish_reason": finish_reason_json(job.finish_reason, job.produced, EOS_TOKEN_ID),
            "prompt_tokens": seq.prompt_tokens,
            "weight_version": "default",
            "num_retractions": 0,
            "reasoning_tokens": 0,
            "completion_tokens": job.produced,
            "cached_tokens": 0,
        }
        if job.finished_at is None:
            return meta
        meta["e2e_latency"] = job.finished_at - job.created
        if self.speculative and seq.verify_ct > 0 and seq.proposed_drafts > 0:
            meta["spec_accept_rate"] = seq.accept_rate
            meta["spec_accept_length"] = job.produced / seq.verify_ct
            meta["spec_num_correct_drafts"] = seq.correct_drafts
            meta["spec_num_proposed_drafts"] = seq.proposed_drafts
            meta["spec_verify_ct"] = seq.verify_ct
            if seq.histogram:
                meta["spec_correct_drafts_histogram"] = list(seq.histogram)
        return meta

    def _sglext(self, reply: Reply) -> dict[str, Any] | None:
        details = spec_details(self.meta_info(reply.job)) if reply.want_spec else None
        return None if details is None else {"spec_tokens_details": details}

    async def pieces(self, reply: Reply) -> AsyncIterator[int]:
        """Token counts to send, one per chunk; -1 asks for the malformed line.

        Runs the stream faults: after exactly `stream_limit` tokens went out (this generator
        resumes only once the caller's chunk was written), exit or stall.
        """
        job, limit, sent, malformed = reply.job, self.faults.stream_limit, 0, reply.malformed
        while True:
            n = await job.next()
            if limit is not None and sent + n >= limit:
                yield limit - sent
                self.faults.limit_reached(limit)
                await self.driver.closing.wait()  # stalled: open and silent until shutdown
                return
            if n or job.done:
                yield n
                sent += n
            if malformed and sent:
                malformed = False
                yield -1
            if job.done:
                return

    async def finished(self, job: Job) -> bool:
        """Wait for a non-streamed job to finish, running the stream faults on it too: once it
        has generated `stream_limit` tokens, exit or stall; False when a stall ends because
        the server shuts down."""
        limit = self.faults.stream_limit
        while True:
            await job.next()
            if limit is not None and job.produced >= limit:
                self.faults.limit_reached(limit)
                await self.driver.closing.wait()  # stalled: no answer until shutdown
                return False
            if job.done:
                return True

    async def chat_stream(self, reply: Reply) -> AsyncIterator[bytes]:
        job, source = reply.job, reply.source
        head = (
            b'data: {"id":' + encode(reply.rid) + b',"object":"chat.completion.chunk","created":'
            + str(reply.created).encode() + b',"model":' + encode(reply.model)
            + b',"choices":[{"index":0,"delta":{"reasoning_content":null'
        )  # fmt: skip
        try:
            first = True
            async for n in self.pieces(reply):
                if n < 0:
                    yield MALFORMED_EVENT
                    continue
                out = b""
                if first:
                    first = False
                    out = head + b',"role":"assistant","content":""}' + _NULL_TAIL + b"}\n\n"
                if n:
                    usage_part = b""
                    if reply.continuous_usage:
                        usage_part = b',"usage":' + encode(usage(job.seq.prompt_tokens, job.taken))
                    text = encode(source.text(n))
                    out += head + b',"content":' + text + b"}" + _NULL_TAIL + usage_part + b"}\n\n"
                if out:
                    yield out
            reason, matched = reply.finish()
            yield (
                head + b'},"logprobs":null,"finish_reason":' + encode(reason)
                + b',"matched_stop":' + encode(matched) + b"}]}\n\n"
            )  # fmt: skip
            yield self._stream_tail(reply, "chat.completion.chunk", exclude_none=False)
        finally:
            self.driver.release(job)

    def _stream_tail(self, reply: Reply, kind: str, *, exclude_none: bool) -> bytes:
        """The sglext chunk (when asked and available), the usage chunk, then [DONE]."""
        out = b""
        sglext = self._sglext(reply)
        if sglext is not None:
            body = {**reply.envelope(kind), "choices": [], "usage": None, "sglext": sglext}
            out += b"data: " + encode(body) + b"\n\n"
        if reply.include_usage:
            counts = usage(reply.job.seq.prompt_tokens, reply.job.produced)
            data: Any = counts
            if exclude_none:  # completions drop null usage fields here (exclude_none=True)
                data = {
                    "prompt_tokens": counts.prompt_tokens,
                    "total_tokens": counts.total_tokens,
                    "completion_tokens": counts.completion_tokens,
                    "reasoning_tokens": 0,
                }
            body = {**reply.envelope(kind), "choices": [], "usage": data}
            out += b"data: " + encode(body) + b"\n\n"
        return out + DONE_EVENT

    def chat_body(self, reply: Reply) -> bytes:
        job = reply.job
        reason, matched = reply.finish()
        text = reply.source.text(job.produced)
        message = {"role": "assistant", "content": text, "reasoning_content": None}
        choice = {"index": 0, "message": message, "logprobs": None}
        body: dict[str, Any] = reply.envelope("chat.completion")
        body["choices"] = [{**choice, "finish_reason": reason, "matched_stop": matched}]
        return self._finish_body(reply, body)

    def _finish_body(self, reply: Reply, body: dict[str, Any]) -> bytes:
        body["usage"] = usage(reply.job.seq.prompt_tokens, reply.job.produced)
        body["metadata"] = {"weight_version": "default"}
        sglext = self._sglext(reply)
        if sglext is not None:
            body["sglext"] = sglext
        return encode(body)

    async def completion_stream(self, reply: Reply) -> AsyncIterator[bytes]:
        job, source = reply.job, reply.source
        head = (
            b'data: {"id":' + encode(reply.rid) + b',"object":"text_completion","created":'
            + str(reply.created).encode() + b',"model":' + encode(reply.model)
            + b',"choices":[{"index":0,"text":'
        )  # fmt: skip
        try:
            prefix = reply.echo
            async for n in self.pieces(reply):
                if n < 0:
                    yield MALFORMED_EVENT
                    continue
                text, prefix = prefix + source.text(n), ""
                reason, matched = reply.finish() if job.done else (None, None)
                usage_part = b"null"
                if reply.continuous_usage:
                    usage_part = encode(usage(job.seq.prompt_tokens, job.taken))
                yield (
                    head + encode(text) + b',"logprobs":null,"finish_reason":' + encode(reason)
                    + b',"matched_stop":' + encode(matched) + b'}],"usage":' + usage_part
                    + b"}\n\n"
                )  # fmt: skip
            yield self._stream_tail(reply, "text_completion", exclude_none=True)
        finally:
            self.driver.release(job)

    def completion_body(self, reply: Reply) -> bytes:
        reason, matched = reply.finish()
        text = reply.echo + reply.source.text(reply.job.produced)
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}
        choice["matched_stop"] = matched
        body: dict[str, Any] = reply.envelope("text_completion")
        body["choices"] = [choice]
        return self._finish_body(reply, body)

    async def generate_stream(self, reply: Reply) -> AsyncIterator[bytes]:
        """Native streaming: each event repeats the whole text and ids so far, as SGLang does."""
        job, source = reply.job, reply.source
        parts: list[str] = []
        ids: list[int] = []
        try:
            async for n in self.pieces(reply):
                if n < 0:
                    yield MALFORMED_EVENT
                    continue
                indices = source.take(n)
                parts.append(source.render(indices))
                ids.extend(source.token_ids(indices))
                out = {"text": "".join(parts), "output_ids": ids, "meta_info": self.meta_info(job)}
                yield b"data: " + encode(out) + b"\n\n"
            yield DONE_EVENT
        finally:
            self.driver.release(job)

    def generate_body(self, reply: Reply) -> bytes:
        indices = reply.source.take(reply.job.produced)
        out = {
            "text": reply.source.render(indices),
            "output_ids": reply.source.token_ids(indices),
            "meta_info": self.meta_info(reply.job),
        }
        return encode(out)
