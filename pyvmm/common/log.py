"""pyvmm's log: what it decided and why, for -v / -vv / --log-level.

Messages go to the ``pyvmm`` logger; the command (cli.py) shows them on
stderr as ``pyvmm: ...`` lines at the level asked for: warnings by default
(only what solo5-hvt would print too, such as "adjusting memory to ..."),
``info`` with -v (privilege mode, device back ends, memory layout, ring
placement), ``debug`` with -vv (also the vCPU's registers when a run ends
in a fault), ``error`` with --quiet (no warnings). A program using pyvmm as
a library configures the logger as it likes.

``log`` stands for that logger without importing ``logging`` (a few
milliseconds of every start: docs/startup.md) until a message is shown:
the command gives it its level and the set-up to run on the first message
that passes (``defer``); below the level a call returns at once. Anything
else (handlers, setLevel, a program's own configuration) goes to the real
logger, which is then imported.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

DEBUG, INFO, WARNING, ERROR = 10, 20, 30, 40


class _Log:
    """logging.getLogger("pyvmm"), imported on first real use."""

    __slots__ = ("_threshold", "_configure")

    def __init__(self) -> None:
        object.__setattr__(self, "_threshold", None)  # None: everything goes to logging
        object.__setattr__(self, "_configure", None)

    def defer(self, threshold: int, configure: Callable[[], None]) -> None:
        """Drop messages below ``threshold`` here; run ``configure`` before
        the first message that passes (the command's handler)."""
        object.__setattr__(self, "_threshold", threshold)
        object.__setattr__(self, "_configure", configure)

    def real(self) -> Any:
        """The logging.Logger itself (configured, if the command deferred it)."""
        import logging

        configure = self._configure
        if configure is not None:
            object.__setattr__(self, "_configure", None)
            object.__setattr__(self, "_threshold", None)
            configure()
        return logging.getLogger("pyvmm")

    def isEnabledFor(self, level: int) -> bool:  # noqa: N802 (logging's name)
        threshold = self._threshold
        if threshold is not None and level < threshold:
            return False
        return self.real().isEnabledFor(level)

    def _log(self, level: int, msg: object, args: tuple, kwargs: dict) -> None:
        threshold = self._threshold
        if threshold is not None and level < threshold:
            return
        self.real().log(level, msg, *args, stacklevel=3, **kwargs)

    def debug(self, msg: object, *args: object, **kwargs: Any) -> None:
        self._log(DEBUG, msg, args, kwargs)

    def info(self, msg: object, *args: object, **kwargs: Any) -> None:
        self._log(INFO, msg, args, kwargs)

    def warning(self, msg: object, *args: object, **kwargs: Any) -> None:
        self._log(WARNING, msg, args, kwargs)

    def error(self, msg: object, *args: object, **kwargs: Any) -> None:
        self._log(ERROR, msg, args, kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real(), name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.real(), name, value)


log = _Log()
