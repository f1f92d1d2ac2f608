"""``ffi`` and ``lib`` of the test-only extension testkit._kit (see build.py),
built first if it is missing or older than its sources."""

from __future__ import annotations

from testkit import build

if build.is_stale():
    build.build()

from testkit._kit import ffi, lib  # noqa: E402

__all__ = ["ffi", "lib"]
