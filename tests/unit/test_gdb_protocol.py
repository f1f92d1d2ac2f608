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


def test_a_register_s_every_byte_is_sent_and_a_wider_value_is_cut_to_its_size():
    # A kernel address uses all 64 bits of rip; eflags is 4 bytes in gdb's
    # layout, so bits above 32 are not sent.
    assert gdbregs.encode(gdbregs.BY_NAME["rip"], {"rip": 0xFFFFFFFF81000010}) == "10000081ffffffff"
    assert gdbregs.encode(gdbregs.BY_NAME["eflags"], {"eflags": 0x1_8000_0202}) == "02020080"


def test_g_packets_have_gdbs_own_sizes_and_every_vector_view_is_128_bits():
    # gdb's amd64 core + sse + segments: 16 GPRs, rip, eflags, 6 segments,
    # 8 x87 registers of 10 bytes, 8 x87 control registers of 4, 16 xmm,
    # mxcsr, fs_base and gs_base; aarch64: x0-x30, sp, pc, cpsr, v0-v31,
    # fpsr and fpcr.
    x87_control = 8 * 4
    assert gdbregs.X86_64.g_size == 16 * 8 + 8 + 4 + 6 * 4 + 8 * 10 + x87_control + 16 * 16 + 4 + 16
    assert gdbregs.AARCH64.g_size == 31 * 8 + 8 + 8 + 4 + 32 * 16 + 4 + 4
    bits = {"ieee_single": 32, "ieee_double": 64}
    bits.update({f"{u}int{n}": n for u in ("", "u") for n in (8, 16, 32, 64)})
    for target in (gdbregs.X86_64, gdbregs.AARCH64):
        root = ET.fromstring(target.xml.split(b"?>", 1)[1].split(b">", 1)[1])
        vectors = list(root.iter("vector"))
        assert len(vectors) == 6
        for vector in vectors:
            assert bits[vector.get("type")] * int(vector.get("count")) == 128, vector.attrib
