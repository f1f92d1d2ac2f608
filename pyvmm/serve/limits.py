"""What one launcher takes on at most, and who may talk to it.

Every resource a client can make the launcher hold is bounded: VM
processes (each a forked interpreter, about 5-18 MiB), pools, open
connections, the time a request may take to arrive, the file
descriptors a request may pass. The defaults suit one host's
orchestration; ``pyvmm serve`` options change them (docs/serve.md).
"""

from __future__ import annotations

from pyvmm.common.errors import UsageError


class Limits:
    """What the launcher allows at once (its options, each with a default)."""

    __slots__ = ("max_vms", "max_pools", "max_connections", "request_timeout", "allow_uids")

    def __init__(
        self,
        max_vms: int = 64,
        max_pools: int = 8,
        max_connections: int = 256,
        request_timeout: float = 10.0,
        allow_uids: frozenset[int] = frozenset(),
    ) -> None:
        #: VM processes at once, pooled (prepared ahead) ones included.
        self.max_vms = max_vms
        #: Pools (command lines with VMs prepared ahead).
        self.max_pools = max_pools
        #: Open client connections (a `pyvmm run` holds one while its VM runs).
        self.max_connections = max_connections
        #: Seconds a client has to send its whole request, and to take its answer.
        self.request_timeout = request_timeout
        #: Users allowed besides root and the launcher's own.
        self.allow_uids = allow_uids

    def view(self) -> dict[str, object]:
        return {
            "max_vms": self.max_vms,
            "max_pools": self.max_pools,
            "max_connections": self.max_connections,
            "request_timeout": self.request_timeout,
            "allow_uids": sorted(self.allow_uids),
        }


OPTIONS = {
    "--max-vms": "max_vms",
    "--max-pools": "max_pools",
    "--max-connections": "max_connections",
    "--request-timeout": "request_timeout",
    "--allow-uid": "allow_uids",
}


def _count(option: str, text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 1_000_000:
        raise UsageError(f"serve: {option}={text}: a count from 1 to 1000000")
    return int(text)


def parse_limits(argv: list[str]) -> Limits:
    """``pyvmm serve``'s options after --api-sock: OPTION=VALUE each."""
    limits = Limits()
    for arg in argv:
        option, eq, value = arg.partition("=")
        name = OPTIONS.get(option)
        if name is None:
            raise UsageError(f"serve: Invalid option: `{arg}' (see pyvmm serve --help)")
        if not eq or not value:
            raise UsageError(f"serve: {option}: missing value ({option}=VALUE)")
        if name == "request_timeout":
            try:
                seconds = float(value.removesuffix("s"))
            except ValueError:
                seconds = -1.0
            if not 0.01 <= seconds <= 3600:
                raise UsageError(f"serve: {option}={value}: seconds from 0.01 to 3600")
            limits.request_timeout = seconds
        elif name == "allow_uids":
            uids = value.split(",")
            if not all(uid.isdigit() and int(uid) < 1 << 32 for uid in uids):
                raise UsageError(f"serve: {option}={value}: user ids (UID[,UID...])")
            limits.allow_uids = limits.allow_uids | {int(uid) for uid in uids}
        else:
            setattr(limits, name, _count(option, value))
    return limits
