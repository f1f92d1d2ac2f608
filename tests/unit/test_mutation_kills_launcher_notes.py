"""Edges that the mutation run found untested in the launcher's request
reader and the loader's notes: a head still open at exactly the limit is
refused (one byte less waits for more), and every Solo5 ABI target has its
own name."""

from __future__ import annotations

import pytest

from pyvmm.loader.notes import AbiInfo
from pyvmm.serve.http import MAX_HEAD, HttpError, RequestReader


def test_a_head_still_open_at_max_head_bytes_is_refused_and_one_less_waits() -> None:
    head = b"GET /v1/vms HTTP/1.1\r\nX-Pad: " + b"a" * MAX_HEAD
    reader = RequestReader()
    assert reader.feed(head[: MAX_HEAD - 1]) is None
    with pytest.raises(HttpError, match=f"request head longer than {MAX_HEAD} bytes") as err:
        RequestReader().feed(head[:MAX_HEAD])
    assert err.value.status == 413


@pytest.mark.parametrize(
    "target, name",
    [(1, "hvt"), (2, "spt"), (3, "virtio"), (4, "muen"), (5, "genode"), (6, "xen"), (7, "unknown")],
)
def test_each_solo5_abi_target_has_its_own_name(target: int, name: str) -> None:
    assert AbiInfo(target=target, version=2).target_name == name


def _whole_head(size: int) -> bytes:
    start, end = b"GET /v1/vms HTTP/1.1\r\nX-Pad: ", b"\r\n\r\n"
    return start + b"a" * (size - len(start) - len(end)) + end


def test_a_whole_head_of_max_head_bytes_is_taken_and_one_byte_more_is_refused() -> None:
    request = RequestReader().feed(_whole_head(MAX_HEAD))
    assert request is not None and request.path == "/v1/vms"
    with pytest.raises(HttpError, match="request head longer than") as err:
        RequestReader().feed(_whole_head(MAX_HEAD + 1))
    assert err.value.status == 413


@pytest.mark.parametrize("cut", [1, 2, 3])
def test_a_blank_head_sent_in_two_pieces_is_refused_at_once(cut: int) -> None:
    """The terminator is found from the first byte on, however it is cut
    (a first piece shorter than the terminator leaves nothing to skip)."""
    reader = RequestReader()
    assert reader.feed(b"\r\n\r\n"[:cut]) is None
    with pytest.raises(HttpError) as err:
        reader.feed(b"\r\n\r\n"[cut:])
    assert err.value.status == 400


@pytest.mark.parametrize("cut", [1, 2])
def test_a_request_whose_first_piece_is_a_byte_or_two_is_read(cut: int) -> None:
    head = b"GET /vms HTTP/1.1\r\nHost: x\r\n\r\n"
    reader = RequestReader()
    assert reader.feed(head[:cut]) is None
    request = reader.feed(head[cut:])
    assert request is not None and (request.method, request.path) == ("GET", "/vms")


@pytest.mark.parametrize("header", ["X-Pad : 1", " X-Pad: 1", ": 1", "X-Pad 1"])
def test_a_header_name_with_blanks_or_none_or_no_colon_is_refused(header: str) -> None:
    with pytest.raises(HttpError, match="malformed header line") as err:
        RequestReader().feed(f"GET /v1/vms HTTP/1.1\r\n{header}\r\n\r\n".encode())
    assert err.value.status == 400


def test_a_body_of_max_body_bytes_is_awaited_and_one_byte_more_refused() -> None:
    from pyvmm.serve.http import MAX_BODY

    assert MAX_BODY == 1 << 20  # the documented limit (docs/serve.md, docs/security.md)
    head = "POST /v1/vms HTTP/1.1\r\nContent-Length: {}\r\n\r\n"
    assert RequestReader().feed(head.format(MAX_BODY).encode()) is None
    with pytest.raises(HttpError, match=f"request body longer than {MAX_BODY} bytes") as err:
        RequestReader().feed(head.format(MAX_BODY + 1).encode())
    assert err.value.status == 413


def test_a_malformed_request_line_is_quoted_to_80_characters() -> None:
    line = "GET " + "x" * 200
    with pytest.raises(HttpError) as err:
        RequestReader().feed(f"{line}\r\n\r\n".encode())
    assert str(err.value) == f"malformed request line: {line[:80]!r}"


def test_every_reason_phrase_is_the_standard_one() -> None:
    from http import HTTPStatus

    from pyvmm.serve.http import REASONS

    # 413's name changed with the RFCs (2616, 7231, 9110) and with Python.
    renamed = {413: {"Request Entity Too Large", "Payload Too Large", "Content Too Large"}}
    for status, phrase in REASONS.items():
        assert phrase in renamed.get(status, {HTTPStatus(status).phrase}), status
    assert {503, 504} <= set(REASONS)
