"""A netlink answer is read by one rule for both questions the tap code
asks (a link's tun attributes, a link's counters): the kernel's refusal
is its errno, another message type or a short answer is EPROTO, and the
attributes follow the header and the question's fixed part."""

from __future__ import annotations

import errno
import struct

import pytest

from pyvmm.devices.net import tap


def _answer(kind: int, body: bytes, seq: int = 1) -> bytes:
    return tap._NLMSGHDR.pack(tap._NLMSGHDR.size + len(body), kind, 0, seq, 0) + body


def _attr(kind: int, payload: bytes) -> bytes:
    length = tap._RTATTR.size + len(payload)
    return tap._RTATTR.pack(length, kind) + payload + bytes(-length % 4)


def test_the_attributes_follow_the_fixed_part():
    fixed = tap._IFINFOMSG.pack(0, 0, 7, 0, 0)
    reply = _answer(tap.RTM_NEWLINK, fixed + _attr(3, b"tap0\0") + _attr(4, b"\1"))
    assert tap._netlink_attrs(reply, tap.RTM_NEWLINK, tap._IFINFOMSG) == {3: b"tap0\0", 4: b"\1"}


def test_the_kernels_refusal_is_its_errno():
    reply = _answer(tap.NLMSG_ERROR, struct.pack("i", -errno.ENODEV) + bytes(16))
    with pytest.raises(OSError) as err:
        tap._netlink_attrs(reply, tap.RTM_NEWSTATS, tap._IF_STATS_MSG)
    assert err.value.errno == errno.ENODEV


@pytest.mark.parametrize(
    "reply", [b"\0" * 8, _answer(tap.RTM_NEWLINK, bytes(tap._IF_STATS_MSG.size))]
)
def test_a_short_answer_or_another_message_is_eproto(reply):
    with pytest.raises(OSError) as err:
        tap._netlink_attrs(reply, tap.RTM_NEWSTATS, tap._IF_STATS_MSG)
    assert err.value.errno == errno.EPROTO
