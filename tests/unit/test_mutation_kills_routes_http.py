"""Edges of the launcher's request handling that a whole-file mutation run
of pyvmm/serve/routes.py and pyvmm/serve/http.py found untested: how much
of a long method or path an error quotes, which methods a 405 offers, each
status's reason phrase, and JSON nesting checked past a scalar."""

from __future__ import annotations

import pytest

from pyvmm.serve.http import MAX_DEPTH, HttpError, nesting_ok, response
from pyvmm.serve.routes import route


def test_a_404_quotes_the_first_200_characters_of_the_path():
    path = "/" + "p" * 300
    with pytest.raises(HttpError) as err:
        route("GET", path)
    assert err.value.status == 404
    assert f"no such resource: {path[:200]}" in str(err.value)
    assert path[:201] not in str(err.value)


def test_a_405_quotes_20_characters_of_the_method_200_of_the_path_and_offers_the_rest():
    method, path = "M" * 30, "/vms/" + "i" * 300
    with pytest.raises(HttpError) as err:
        route(method, path)
    assert err.value.status == 405
    text = str(err.value)
    assert f"{method[:20]} {path[:200]}: use GET or DELETE" in text
    assert method[:21] not in text and path[:201] not in text


#: RFC 9110's reason phrases for every status the launcher answers with
#: (written out here, not read from the table under test).
PHRASES = {
    200: "OK",
    201: "Created",
    400: "Bad Request",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    409: "Conflict",
    411: "Length Required",
    413: "Payload Too Large",
    500: "Internal Server Error",
    501: "Not Implemented",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}


@pytest.mark.parametrize("status", sorted(PHRASES))
def test_each_status_has_its_own_reason_phrase(status):
    assert response(status, {}).startswith(f"HTTP/1.1 {status} {PHRASES[status]}\r\n".encode())


def test_the_reason_table_is_exactly_these():
    from pyvmm.serve.http import REASONS

    assert REASONS == PHRASES


def test_nesting_is_checked_past_a_scalar_beside_the_deep_value():
    deep: list = []
    for _ in range(MAX_DEPTH + 1):
        deep = [deep]
    assert not nesting_ok([deep, 1])
    assert not nesting_ok({"a": deep, "b": "x"})
    assert nesting_ok([[1], 2, "three"])


def test_a_blank_head_in_one_piece_is_refused_at_once():
    from pyvmm.serve.http import RequestReader

    with pytest.raises(HttpError) as err:
        RequestReader().feed(b"\r\n\r\n")
    assert err.value.status == 400


@pytest.mark.parametrize("where", ["line", "header"])
def test_a_control_character_in_the_head_is_refused_and_quoted(where):
    from pyvmm.serve.http import RequestReader

    line, header = "GET /vms HTTP/1.1", "X-Pad: 1"
    if where == "line":
        line = "GET /vms\x01 HTTP/1.1"
    else:
        header = "X-Pad: \x01" + "p" * 100
    bad = line if where == "line" else header
    with pytest.raises(HttpError) as err:
        RequestReader().feed(f"{line}\r\nHost: x\r\n{header}\r\n\r\n".encode())
    assert err.value.status == 400
    assert str(err.value).endswith(f"a control character in the request head: {bad[:80]!r}")
    # A tab is a header value's space, not a control character.
    ok = RequestReader().feed(b"GET /vms HTTP/1.1\r\nHost:\tx\r\n\r\n")
    assert ok is not None


def test_json_too_deep_for_the_parser_itself_is_one_line():
    from pyvmm.serve.http import parse_json

    with pytest.raises(ValueError, match=rf"^the body nests deeper than {MAX_DEPTH} levels$"):
        parse_json("[" * 200_000 + "]" * 200_000, "the body")


def test_bad_json_and_bad_utf8_are_one_line():
    from pyvmm.serve.http import parse_json

    for data in (b"{", b"\xff\xfe{}"):
        with pytest.raises(ValueError, match=r"^bad JSON in the body: "):
            parse_json(data, "the body")


def test_a_head_that_is_not_ascii_is_a_400():
    from pyvmm.serve.http import RequestReader

    with pytest.raises(HttpError) as err:
        RequestReader().feed("GET /vms HTTP/1.1\r\nX: \u00e9\r\n\r\n".encode())
    assert err.value.status == 400 and "not ASCII" in str(err.value)


def test_a_response_that_is_not_http_or_not_json_is_named_in_80_characters():
    from pyvmm.serve.http import parse_response

    line = "X" * 100
    with pytest.raises(ValueError) as err:
        parse_response(f"{line}\r\n\r\n".encode())
    assert str(err.value) == f"not an HTTP response: {line[:80]!r}"
    body = b"<" * 100
    with pytest.raises(ValueError) as err:
        parse_response(b"HTTP/1.1 200 OK\r\n\r\n" + body)
    assert str(err.value) == f"response body is not JSON: {body[:80]!r}"
    assert parse_response(b"HTTP/1.1 404 Not Found\r\nA: b\r\n\r\n{}") == (404, {})


def test_a_response_body_lists_its_keys_sorted():
    assert response(200, {"b": 1, "a": 2}).endswith(b'\r\n\r\n{"a": 2, "b": 1}\n')


def test_a_bad_content_length_is_a_400():
    from pyvmm.serve.http import RequestReader

    with pytest.raises(HttpError) as err:
        RequestReader().feed(b"POST /vms HTTP/1.1\r\nHost: x\r\nContent-Length: ten\r\n\r\n")
    assert err.value.status == 400 and "bad Content-Length" in str(err.value)


def test_a_bad_status_line_is_quoted_without_the_headers():
    from pyvmm.serve.http import parse_response

    with pytest.raises(ValueError) as err:
        parse_response(b"HTTP/1.1 abc OK\r\nA: b\r\n\r\n")
    assert str(err.value) == "not an HTTP response: 'HTTP/1.1 abc OK'"


def test_a_status_line_without_a_reason_phrase_is_a_response():
    from pyvmm.serve.http import parse_response

    assert parse_response(b"HTTP/1.1 204\r\n\r\n") == (204, None)


def test_a_malformed_header_line_is_quoted_in_80_characters():
    from pyvmm.serve.http import RequestReader

    header = "X" * 100
    with pytest.raises(HttpError) as err:
        RequestReader().feed(f"GET /vms HTTP/1.1\r\nHost: x\r\n{header}\r\n\r\n".encode())
    assert err.value.status == 400
    assert str(err.value).endswith(f"malformed header line: {header[:80]!r}")


def test_a_chunked_body_is_a_501():
    from pyvmm.serve.http import RequestReader

    with pytest.raises(HttpError) as err:
        RequestReader().feed(b"POST /vms HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
    assert err.value.status == 501 and "chunked request bodies are not supported" in str(err.value)


def test_a_json_number_past_a_double_is_refused_quoting_40_characters():
    from pyvmm.serve.http import parse_json

    number = "1" + "0" * 45 + "e400"
    with pytest.raises(ValueError) as err:
        parse_json(f"[{number}]", "the body")
    assert str(err.value) == f"bad JSON in the body: {number[:40]} is out of range"


def test_a_bad_content_length_is_quoted_in_40_characters():
    from pyvmm.serve.http import RequestReader

    value = "x" * 60
    with pytest.raises(HttpError) as err:
        RequestReader().feed(f"POST /vms HTTP/1.1\r\nContent-Length: {value}\r\n\r\n".encode())
    assert str(err.value).endswith(f"bad Content-Length: {value[:40]!r}")
