"""Where a stored response lives: the bounded id -> backend map, and the paths that name one."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from specroute.proxy.routes import STORED_RESPONSE, find_route, stored_response_id
from specroute.proxy.stored import ResponseHomes


def test_the_least_recently_used_id_is_forgotten_first() -> None:
    homes = ResponseHomes(limit=2)
    homes.remember("resp_a", "deep")
    homes.remember("resp_b", "shallow")
    assert homes.home("resp_a") == "deep"  # a use keeps it
    homes.remember("resp_c", "deep")
    assert homes.home("resp_b") is None
    assert (homes.home("resp_a"), homes.home("resp_c"), len(homes)) == ("deep", "deep", 2)


@given(st.lists(st.tuples(st.integers(0, 30), st.sampled_from(["a", "b"])), max_size=200))
def test_the_map_never_outgrows_its_limit_and_keeps_the_newest(
    writes: list[tuple[int, str]],
) -> None:
    homes = ResponseHomes(limit=8)
    for number, backend in writes:
        homes.remember(f"resp_{number}", backend)
        assert len(homes) <= 8
    if writes:
        number, backend = writes[-1]
        assert homes.home(f"resp_{number}") == backend


def test_retrieval_and_cancel_paths_name_their_response() -> None:
    assert stored_response_id("GET", "/v1/responses/resp_1") == "resp_1"
    assert stored_response_id("POST", "/v1/responses/resp_1/cancel") == "resp_1"
    for method, path in [
        ("POST", "/v1/responses/resp_1"),
        ("GET", "/v1/responses/resp_1/cancel"),
        ("GET", "/v1/responses/"),
        ("POST", "/v1/responses//cancel"),
        ("GET", "/v1/responses/a/b"),
    ]:
        assert stored_response_id(method, path) is None, (method, path)
    route = find_route("GET", "/v1/responses/resp_1")
    assert route is not None
    assert (route.kind, route.generates) == (STORED_RESPONSE, False)
    assert find_route("GET", "/v1/responses") is None
