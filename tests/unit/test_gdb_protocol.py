"""The GDB stub's remote-protocol framing and register layout, without a
guest: packets over a socketpair, escapes, checksums, hostile input."""

from __future__ import annotations

import os
import socket
import xml.etree.ElementTree as ET

import pytest

from pyvmm.vm.debug import gdbregs
from pyvmm.vm.debug.rsp import MAX_PACKET, Connection, Disconnected, escape, frame, unescape


@pytest.fixture
def pair():
    ours, theirs = socket.socketpair()
    stop = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
    conn = Connection(ours.detach(), stop)
    yield conn, theirs
    conn.close()
    theirs.close()
    os.close(stop)


def test_escape_round_trip_of_every_byte():
    data = bytes(range(256)) * 2
    escaped = escape(data)
    assert not any(byte in escaped for byte in b"#$*")
    assert unescape(escaped) == data


def test_frame_checksum():
    assert frame(b"OK") == b"$OK#9a"


def test_receive_acknowledges_and_skips_bad_packets(pair):
    conn, client = pair
    client.sendall(b"junk$g#00" + frame(b"m0,4") + b"\x03" + frame(b"?"))
    assert conn.receive() == b"m0,4"
    assert conn.receive() == b"?"
    assert client.recv(16) == b"-++"
    assert conn.poll_interrupt()  # the 0x03 between packets
    assert not conn.poll_interrupt()


def test_overlong_packet_is_dropped_whole(pair):
    conn, client = pair
    client.setblocking(True)
    body = b"A" * (MAX_PACKET + 10)
    client.sendall(frame(body) + frame(b"qC"))
    assert conn.receive() == b"qC"
    assert client.recv(16) == b"-+"


def test_binary_body_is_unescaped(pair):
    conn, client = pair
    client.sendall(frame(b"X0,2:" + escape(b"#}")))
    assert conn.receive() == b"X0,2:#}"


def test_end_of_connection_is_a_disconnect(pair):
    conn, client = pair
    client.sendall(b"$qC#")
    client.close()
    with pytest.raises(Disconnected):
        conn.receive()


def test_resend_on_minus(pair):
    conn, client = pair
    conn.send(b"OK")
    client.sendall(b"-" + frame(b"?"))
    assert conn.receive() == b"?"
    assert client.recv(64) == b"$OK#9a$OK#9a+"


def test_register_layout_matches_the_target_description():
    target = ET.fromstring(gdbregs.TARGET_XML.split(b"?>", 1)[1].split(b">", 1)[1])
    regs = [r for feature in target.iter("feature") for r in feature.iter("reg")]
    assert [r.get("name") for r in regs] == [r.name for r in gdbregs.REGISTERS]
    assert [int(r.get("regnum")) for r in regs] == list(range(len(gdbregs.REGISTERS)))
    assert [int(r.get("bitsize")) for r in regs] == [8 * r.size for r in gdbregs.REGISTERS]
    assert gdbregs.REGISTERS[gdbregs.BY_NAME["rip"]].size == 8
    values = {"rip": 0x100000, "eflags": 0x202}
    encoded = gdbregs.encode_all(values)
    assert len(encoded) == 2 * gdbregs.G_SIZE
    decoded = gdbregs.decode_all(bytes.fromhex(encoded.replace("x", "0")))
    assert decoded["rip"] == 0x100000 and decoded["eflags"] == 0x202
