"""A reply the backend ended with finish_reason "abort" is a failure, not an answer. SGLang
ends an aborted request (`/abort_request`, a shutdown, a drain's end) with
`meta_info.finish_reason = {"type": "abort", ...}`; without a `status_code` (a graceful abort)
its OpenAI layer sends it on as an ordinary chunk whose choice has `finish_reason: "abort"`
(`_generate_chat_stream` in `srt/entrypoints/openai/serving_chat.py`: "falls through to the
normal chunk path"; the non-streamed reply the same, `_handle_abort_finish_reason` in the
tokenizer manager); vLLM's `FinishReason.ABORT` reads the same (`vllm/v1/engine/__init__.py`).
Only a payload holding the bytes `"abort"` is parsed."""

from __future__ import annotations

import msgspec

from specroute.pool import StreamBroken

__all__ = ["ABORT_MARK", "BackendAborted", "aborted"]

ABORT_MARK = b'"abort"'
"""In every payload that `aborted` can judge an abort: without it, no decoding is needed."""


class BackendAborted(StreamBroken):
    """The backend ended the request itself (finish_reason "abort"): a mid-stream failure
    (migration cause "aborted"), or a whole reply to send again."""


class _Reason(msgspec.Struct):
    type: str | None = None


class _Finish(msgspec.Struct):
    finish_reason: str | _Reason | None = None


class _Ended(msgspec.Struct):
    """What says a reply ended: each choice's reason (OpenAI routes), or SGLang's own
    `meta_info` (`/generate`)."""

    choices: list[_Finish] = []
    meta_info: _Finish | None = None


_ended = msgspec.json.Decoder(_Ended)


def _is_abort(reason: str | _Reason | None) -> bool:
    return reason == "abort" or (isinstance(reason, _Reason) and reason.type == "abort")


def aborted(payload: bytes) -> bool:
    """Whether an event's payload or a whole reply says the backend aborted the request."""
    if ABORT_MARK not in payload:
        return False
    try:
        ended = _ended.decode(payload)
    except msgspec.DecodeError:
        return False
    if ended.meta_info is not None and _is_abort(ended.meta_info.finish_reason):
        return True
    return any(_is_abort(choice.finish_reason) for choice in ended.choices)
