"""The launcher's HTTP request parser under hypothesis, bounded (a few
seconds): requests that are well formed in part (a method, a path of the
API's or not, headers, a Content-Length that may lie, a body of JSON or
not), cut into pieces anywhere, through testkit/fuzztargets.py's ``http``
target, the one bench/fuzz.py runs under atheris. The parser may only
answer a request or refuse it with HttpError; the limits (head, body,
nesting) hold however the bytes arrive. Crashes a long run found are in
tests/fuzz_regressions/http-* (replayed by test_fuzz.py)."""

from __future__ import annotations

import json
from collections import Counter

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from pyvmm.serve import http
from testkit import fuzztargets

SETTINGS = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    # The same examples on every run (the seed from the test itself): the
    # floors below are about what the strategies reach, and a random seed made
    # them a coin toss (9 accepted manifests of 150 against a floor of 10 once).
    # Open-ended search is bench/fuzz.py's job.
    derandomize=True,
    database=None,
)

METHODS = st.sampled_from(["GET", "POST", "DELETE", "PUT", "get", "", "G ET", "POST\t"])
PATHS = st.one_of(
    st.sampled_from(
        [
            "/",
            "/v1",
            "/openapi.json",
            "/vms",
            "/v1/vms",
            "/vms/a-1",
            "/v1/vms/x/stop",
            "/vms/x/wait",
            "/vms/x/stats",
            "/vms/x/y/z",
            "/pool",
            "/v2/vms",
            "//vms//",
            "/vms?x=1",
            "*",
        ]
    ),
    st.text(max_size=30),
)
VERSIONS = st.sampled_from(["HTTP/1.1", "HTTP/1.0", "HTTP/2", "http/1.1", ""])
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=12,
)


@st.composite
def bodies(draw) -> bytes:
    kind = draw(st.integers(0, 4))
    if kind == 0:
        return b""
    if kind == 1:
        return json.dumps({"argv": draw(st.lists(st.text(max_size=8), max_size=4))}).encode()
    if kind == 2:
        return json.dumps(draw(JSON)).encode()
    if kind == 3:  # nested past the limit, or just under it
        depth = draw(st.sampled_from([http.MAX_DEPTH, http.MAX_DEPTH + 1, 5000]))
        return b"[" * depth + b"]" * depth
    return draw(st.binary(max_size=64))


@st.composite
def requests(draw) -> bytes:
    body = draw(bodies())
    headers = draw(
        st.lists(
            st.sampled_from(
                [
                    "Host: localhost",
                    "Expect: 100-continue",
                    "Transfer-Encoding: chunked",
                    "Content-Type: application/json",
                    "X: \t y",
                    "Bad header",
                    " Folded: x",
                    "Content-Length: -1",
                    "Content-Length: 99999999999",
                ]
            ),
            max_size=4,
        )
    )
    length = draw(st.sampled_from([len(body), len(body), max(0, len(body) - 1), len(body) + 5]))
    headers.append(f"Content-Length: {length}")
    if draw(st.booleans()):
        headers.append("X-Pad: " + "p" * draw(st.sampled_from([100, http.MAX_HEAD - 60, 17000])))
    line = f"{draw(METHODS)} {draw(PATHS)} {draw(VERSIONS)}"
    head = "\r\n".join([line, *headers]).encode("utf-8", "surrogateescape") + b"\r\n\r\n"
    data = head + body
    if draw(st.booleans()):  # a byte changed anywhere
        at = draw(st.integers(0, len(data) - 1))
        data = data[:at] + bytes([draw(st.integers(0, 255))]) + data[at + 1 :]
    cut = draw(st.integers(0, 255))  # where the pieces are cut (fuzztargets.http)
    return bytes([cut]) + data


def test_requests_cut_anywhere_are_answered_or_refused_with_an_http_error() -> None:
    outcomes: Counter = Counter()

    @SETTINGS
    @given(requests())
    def run(data: bytes) -> None:
        outcome = fuzztargets.http(data)
        event(outcome)
        outcomes[outcome] += 1

    run()
    assert outcomes["accepted"] >= 5 and outcomes["refused"] >= 50, outcomes


def test_raw_bytes_too() -> None:
    @SETTINGS
    @given(st.binary(max_size=300))
    def run(data: bytes) -> None:
        fuzztargets.http(data)

    run()


def test_a_head_over_the_limit_is_refused_however_it_arrives() -> None:
    """Whole (its end in the same piece) or byte by byte."""
    head = b"GET / HTTP/1.1\r\nX: " + b"a" * http.MAX_HEAD + b"\r\n\r\n"
    for step in (len(head), 4096, 1):
        reader = http.RequestReader()
        try:
            for at in range(0, len(head), step):
                assert reader.feed(head[at : at + step]) is None
        except http.HttpError as err:
            assert err.status == 413
            assert at <= http.MAX_HEAD  # refused before the limit was passed by a piece
        else:
            raise AssertionError(f"a {len(head)}-byte head accepted, in pieces of {step}")


def test_nesting_past_the_limit_is_a_400_with_one_line() -> None:
    for depth in (http.MAX_DEPTH + 1, 100_000):
        body = b'{"a": ' * depth + b"1" + b"}" * depth
        request = http.Request("POST", "/vms", "", {}, body)
        try:
            request.json()
        except http.HttpError as err:
            assert err.status == 400
            assert str(err) == f"the request body nests deeper than {http.MAX_DEPTH} levels"
        else:
            raise AssertionError(depth)
    ok = b'{"a": ' * (http.MAX_DEPTH - 1) + b"{}" + b"}" * (http.MAX_DEPTH - 1)
    assert http.Request("POST", "/vms", "", {}, ok).json()
