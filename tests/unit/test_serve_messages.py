"""What the launcher takes from a VM's process (pyvmm/serve/events.py)
and what it copies from its stderr to the log (pyvmm/serve/relay.py),
without a VM: each event child.py sends is taken with the fields the
launcher uses, anything else is a one-line BadMessage; a VM's lines
reach the log named, cut to a bounded length, never blocking."""

from __future__ import annotations

import json
import os

import pytest

from pyvmm.serve import relay
from pyvmm.serve.events import MAX_MESSAGE, BadMessage, parse_event

REPORT = {"schema": "pyvmm-stats/1", "seconds": 0.5}
GOOD = [
    {"event": "running", "times": {"forked": 1, "child": 2, "running": 3}, "cpu_ns": 5},
    {"event": "prepared", "times": {"forked": 1, "ready": 2}},
    {"event": "error", "message": "pyvmm: x", "status": 1, "running": False},
    {"event": "error", "message": "pyvmm: internal error: y", "status": 1, "internal": True},
    {"event": "stats", "report": REPORT},
    {"event": "stats", "error": "no counters: z"},
    {"event": "final", "report": REPORT},
    {"event": "imports", "imported_after_fork": ["json.decoder"]},
]


@pytest.mark.parametrize("event", GOOD, ids=[e["event"] for e in GOOD])
def test_the_events_a_vm_sends_are_taken(event):
    parsed = parse_event(json.dumps(event).encode())
    assert parsed["event"] == event["event"]
    for key, value in event.items():
        assert parsed.get(key, False) == value


BAD = {
    b'{"event": "running", "times": {"running": "x"}, "cpu_ns": 1}': '"times.running"',
    b'{"event": "running", "times": {"running": true}, "cpu_ns": 1}': '"times.running"',
    b'{"event": "running", "times": {"running": -1}, "cpu_ns": 1}': '"times.running"',
    b'{"event": "running", "times": {}, "cpu_ns": 1e400}': "out of range",
    b'{"event": "running", "times": {}, "cpu_ns": NaN}': "NaN is not a JSON number",
    b'{"event": "running", "times": {}, "cpu_ns": 1.5}': '"cpu_ns"',
    b'{"event": "prepared", "times": {"later": 1}}': '"times" must be an object of',
    b'{"event": "prepared", "times": [1]}': '"times" must be an object of',
    b'{"event": "error", "message": 1, "status": 1}': '"message" must be a string',
    b'{"event": "error", "message": "x", "status": 300}': '"status" must be an integer',
    b'{"event": "error", "message": "x", "status": 1, "internal": 1}': '"internal"',
    b'{"event": "stats", "report": [1]}': '"report" must be the counters',
    b'{"event": "final", "report": {"schema": "other"}}': '"report" must be the counters',
    b'{"event": "imports", "imported_after_fork": [1]}': '"imported_after_fork"',
    b'{"event": "nosuch"}': "an unknown event 'nosuch'",
    b'{"event": ["x"]}': "an unknown event 'list'",
    b"[1, 2]": "not a JSON object",
    b"\xff": "bad JSON in the message",
    b"[" * 50 + b"]" * 50: "nests deeper than 32 levels",
    b"[" * 30000 + b"]" * 30000: "nests deeper than 32 levels",
    b" " * (MAX_MESSAGE + 1): f"longer than {MAX_MESSAGE} bytes",
}


@pytest.mark.parametrize("packet, why", BAD.items(), ids=range(len(BAD)))
def test_anything_else_is_a_bad_message_of_one_line(packet, why):
    with pytest.raises(BadMessage) as caught:
        parse_event(packet)
    assert why in str(caught.value) and "\n" not in str(caught.value)


def test_an_error_message_is_kept_as_one_bounded_line():
    event = parse_event(
        json.dumps({"event": "error", "message": "a\nb" * 5000, "status": 2}).encode()
    )
    assert "\n" not in event["message"] and len(event["message"]) <= 4096


def test_a_vms_lines_reach_the_log_named_cut_and_never_blocking(tmp_path, monkeypatch):
    log_r, log_w = os.pipe()
    monkeypatch.setattr(relay, "LOG_FD", log_w)
    pipe = relay.StderrRelay("web1")
    try:
        os.write(
            pipe.write_fd, b"pyvmm: stopped by SIGTERM (Exiting on signal 15)\nplain line\npart"
        )
        assert pipe.read()
        assert os.read(log_r, 65536) == (
            b"pyvmm: vm web1: stopped by SIGTERM (Exiting on signal 15)\n"
            b"pyvmm: vm web1: plain line\n"
        )
        os.write(pipe.write_fd, b"x" * 5000 + b"\n")
        assert pipe.read()
        lines = os.read(log_r, 65536).decode().splitlines()
        assert lines[0] == "pyvmm: vm web1: part" + "x" * (relay.MAX_LINE - 4)
        assert "".join(line.removeprefix("pyvmm: vm web1: ") for line in lines) == (
            "part" + "x" * 5000
        )
        assert all(len(line) <= relay.MAX_LINE + 20 for line in lines)
        # A log nobody reads: lines are dropped and counted, the relay goes on.
        os.set_blocking(log_w, False)
        try:
            while True:
                os.write(log_w, b"." * 4096)
        except BlockingIOError:
            pass
        os.write(pipe.write_fd, b"lost\n")
        assert pipe.read() and pipe.dropped == 1
        os.set_blocking(log_r, False)
        try:
            while os.read(log_r, 65536).strip(b".") == b"":
                pass
        except BlockingIOError:
            pass
        os.set_blocking(log_r, True)
        os.write(pipe.write_fd, b"again\n")
        assert pipe.read()
        assert os.read(log_r, 65536) == (
            b"pyvmm: vm web1: (1 lines dropped: the log was full)\npyvmm: vm web1: again\n"
        )
        pipe.given()
        assert not pipe.read()  # the VM's end closed: done
    finally:
        pipe.close()
        os.close(log_r)
        os.close(log_w)


@pytest.mark.parametrize("addr", [1, 0x7F00_0000_0000, 2**64 - 1])
def test_a_snapshot_event_takes_any_memory_address_a_pointer_can_hold(addr):
    event = {"event": "snapshot", "metadata": {"a": 1}, "state": "AAEC", "memory_addr": addr}
    parsed = parse_event(json.dumps(event).encode())
    assert parsed == {
        "event": "snapshot",
        "metadata": {"a": 1},
        "state": b"\x00\x01\x02",
        "memory_addr": addr,
    }


@pytest.mark.parametrize("addr", [0, -1, 2**64])
def test_a_snapshot_event_s_memory_address_outside_a_pointer_is_refused(addr):
    event = {"event": "snapshot", "metadata": {}, "state": "AAEC", "memory_addr": addr}
    with pytest.raises(BadMessage, match='"memory_addr"'):
        parse_event(json.dumps(event).encode())
