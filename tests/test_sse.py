"""SSE parsing gives the same events wherever the network splits the byte stream, whatever its
line endings; the splitter hands back each event's bytes as they came."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from specroute.sse import DONE, EventTooLarge, SSEDecoder, SSESplitter, event_data

# Payloads without line breaks (SSE data lines cannot hold them) but with JSON-ish bytes,
# multi-byte UTF-8 and colons, so splits can land inside any of them.
payloads = st.lists(
    st.text(
        alphabet=st.characters(codec="utf-8", exclude_characters="\r\n"),
        max_size=40,
    ).map(str.encode),
    min_size=1,
    max_size=8,
)
line_endings = st.sampled_from([b"\n", b"\r\n", b"\r"])


def wire_bytes(events: list[bytes], eol: bytes, comments: bool) -> bytes:
    out = b""
    for event in events:
        if comments:
            out += b": keep-alive" + eol
        out += b"data: " + event + eol + eol
    return out


def decode_split(data: bytes, cuts: list[int]) -> list[bytes]:
    decoder = SSEDecoder()
    events: list[bytes] = []
    points = sorted({c % (len(data) + 1) for c in cuts})
    start = 0
    for point in [*points, len(data)]:
        events += decoder.feed(data[start:point])
        start = point
    assert not decoder.close()
    return events


@given(payloads, line_endings, st.booleans(), st.lists(st.integers(min_value=0), max_size=20))
def test_events_do_not_depend_on_where_the_stream_is_split(
    events: list[bytes], eol: bytes, comments: bool, cuts: list[int]
) -> None:
    data = wire_bytes(events, eol, comments)
    assert decode_split(data, cuts) == events


@given(payloads, line_endings)
def test_byte_by_byte_feeding_equals_one_feed(events: list[bytes], eol: bytes) -> None:
    data = wire_bytes(events, eol, comments=False)
    one = SSEDecoder().feed(data)
    decoder = SSEDecoder()
    single: list[bytes] = []
    for i in range(len(data)):
        single += decoder.feed(data[i : i + 1])
    assert single == one == events


@given(line_endings, st.lists(st.integers(min_value=0), max_size=10))
def test_multi_line_data_fields_join_with_newline(eol: bytes, cuts: list[int]) -> None:
    data = b"data: first" + eol + b"data:second" + eol + eol + b"data: [DONE]\n\n"
    assert decode_split(data, cuts) == [b"first\nsecond", DONE]
    assert decode_split(data, list(range(len(data)))) == [b"first\nsecond", DONE]  # bytewise


def test_unterminated_event_is_dropped_and_reported_on_close() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: complete\n\ndata: partial") == [b"complete"]
    assert decoder.close() is True


def split_at(
    data: bytes, cuts: list[int], cap: int | None = None
) -> list[tuple[bytes, bytes | None]]:
    splitter = SSESplitter(cap)
    events: list[tuple[bytes, bytes | None]] = []
    points = sorted({c % (len(data) + 1) for c in cuts})
    for start, end in zip([0, *points], [*points, len(data)], strict=True):
        events += splitter.feed(data[start:end])
    assert splitter.rest() == b""
    return events


@given(payloads, line_endings, st.booleans(), st.lists(st.integers(min_value=0), max_size=20))
def test_split_events_join_to_the_bytes_fed_and_carry_their_data(
    events: list[bytes], eol: bytes, comments: bool, cuts: list[int]
) -> None:
    data = wire_bytes(events, eol, comments)
    split = split_at(data, cuts)
    assert b"".join(e for e, _ in split) == data
    assert [d for _, d in split if d is not None] == events
    assert all(d == event_data(e) for e, d in split)


def test_an_event_is_handed_back_as_soon_as_its_empty_line_arrives() -> None:
    for eol in (b"\n", b"\r\n", b"\r"):
        splitter = SSESplitter()
        assert splitter.feed(b"data: one" + eol) == []
        assert splitter.feed(eol + b"data: tw") == [(b"data: one" + eol + eol, b"one")]
        assert splitter.rest() == b"data: tw"


def test_a_crlf_is_one_line_end_even_when_split_between_chunks() -> None:
    splitter = SSESplitter()
    assert splitter.feed(b"data: a\r") == []
    assert splitter.feed(b"\ndata: b\r\n\r") == [(b"data: a\r\ndata: b\r\n\r", b"a\nb")]
    assert splitter.feed(b"\n") == [(b"\n", None)]  # that CR's LF: nothing left waiting
    assert splitter.rest() == b""


def test_events_without_data_have_none() -> None:
    assert event_data(b": keep-alive\n\n") is None
    assert event_data(b"event: ping\r\n\r\n") is None
    assert event_data(b"\n") is None
    assert event_data(b"data\n\n") == b""


@given(payloads, line_endings, st.lists(st.integers(min_value=0), max_size=20))
def test_a_cap_no_event_reaches_changes_nothing_and_an_endless_event_raises_at_it(
    events: list[bytes], eol: bytes, cuts: list[int]
) -> None:
    data = wire_bytes(events, eol, False)
    longest = max(len(b"data: " + e + eol + eol) for e in events)
    assert split_at(data, cuts, cap=longest) == split_at(data, cuts)
    endless = data + b"data: " + b"x" * (4 * longest)
    with pytest.raises(EventTooLarge):
        split_at(endless, cuts, cap=longest)
