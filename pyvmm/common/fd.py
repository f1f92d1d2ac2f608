"""What every object that owns one file descriptor does (KVM fds, devices)."""

from __future__ import annotations

import os
from types import TracebackType

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing (docs/startup.md)
if TYPE_CHECKING:
    from typing import Self


class OwnedFd:
    """Owns ``self.fd``: closes it once, on ``close()`` or leaving a ``with``."""

    fd: int

    def fileno(self) -> int:
        """The descriptor, for epoll and for the C data plane (-1 once closed)."""
        return self.fd

    @property
    def closed(self) -> bool:
        return self.fd < 0

    def close(self) -> None:
        """Safe to call more than once."""
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
