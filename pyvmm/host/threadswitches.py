"""How often a thread of this process gave up its CPU: the kernel's
voluntary (it blocked or yielded) and involuntary (it was preempted)
context switches, from /proc/self/task/TID/status.

The file is opened when counting starts, before the sandbox refuses
``open``; reading it later is a ``pread``. A thread that has ended can no
longer be read, so the last good reading is kept: read once more just
before the thread ends to get its whole count (docs/stats.md)."""

from __future__ import annotations

import os

#: The counter names in --stats-json, for each thread counted.
SWITCH_KEYS = ("voluntary_switches", "involuntary_switches")
_FIELDS = {b"voluntary_ctxt_switches": 0, b"nonvoluntary_ctxt_switches": 1}


def _parse(text: bytes) -> tuple[int, int] | None:
    found = [-1, -1]
    for line in text.splitlines():
        name, _, value = line.partition(b":")
        index = _FIELDS.get(name)
        if index is not None:
            found[index] = int(value)
    return (found[0], found[1]) if min(found) >= 0 else None


class ThreadSwitches:
    """The switches of thread ``tid`` since this object was made."""

    def __init__(self, tid: int) -> None:
        self._fd = os.open(f"/proc/self/task/{tid}/status", os.O_RDONLY | os.O_CLOEXEC)
        self._base = self._raw() or (0, 0)
        self._last = (0, 0)

    def _raw(self) -> tuple[int, int] | None:
        if self._fd < 0:
            return None
        try:
            return _parse(os.pread(self._fd, 4096, 0))
        except OSError:  # the thread has ended (ESRCH)
            return None

    def read(self) -> dict[str, int]:
        """The counts so far, or the last good ones once the thread is gone."""
        now = self._raw()
        if now is not None:
            self._last = (now[0] - self._base[0], now[1] - self._base[1])
        return dict(zip(SWITCH_KEYS, self._last, strict=True))

    def close(self) -> None:
        """Keep the last reading; later reads return it."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
