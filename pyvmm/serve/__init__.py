"""The warm launcher (``pyvmm serve``) and its client (``pyvmm run``).

    pyvmm serve --api-sock PATH
    pyvmm run --api-sock PATH [OPTIONS] [--] KERNEL [ARGS...]

One launcher process imports everything a run needs once, then forks a
child per VM on request over an HTTP/JSON Unix socket (docs/serve.md):
the child is that VM's own process, and the interpreter's pages stay
shared copy-on-write between VMs. Modules: ``http`` (the little HTTP),
``routes`` (its paths), ``openapi`` (their description), ``server`` (the
loop and the API), ``limits`` (what it takes on), ``peer`` (who may talk
to whom), ``events`` (what a VM's process may say), ``relay`` (a VM's
lines in the log), ``vms`` (request -> plan -> fork), ``child`` (the VM's
process), ``snapshot`` (a running VM's snapshot, split at the sandbox's
line), ``warm`` (what is done once), ``client``.
This module imports none of them until a subcommand needs it, so that
``pyvmm run`` stays a small client.
"""

from __future__ import annotations

import sys

from pyvmm.common import stopping
from pyvmm.common.errors import UsageError

SUBCOMMANDS = ("serve", "run", "snapshot")
USAGE = """\
usage: pyvmm serve --api-sock PATH [LIMITS]
       pyvmm run --api-sock PATH [OPTIONS] [--] KERNEL [ARGS...]
       pyvmm snapshot --api-sock PATH [--stop] ID DIR

serve: a warm launcher: imports pyvmm once, then starts each VM as a child
  process on request over the Unix socket PATH (HTTP/JSON, docs/serve.md;
  GET /openapi.json describes it); SIGTERM or SIGINT stops every VM, waits
  for them and ends. Only root and the launcher's own user may use it.
  LIMITS:
  --max-vms=N            VM processes at once, pooled ones included (64)
  --max-pools=N          pools of VMs prepared ahead (8)
  --max-connections=N    client connections open at once (256)
  --request-timeout=S    seconds to send a request, and to take its answer (10)
  --allow-uid=UID[,UID]  users who may use it besides root and its own
run: the pyvmm command through that launcher: the same OPTIONS, console
  and exit status, the VM started by the launcher (which must be root's or
  this user's: nothing is sent to another's).
snapshot: a snapshot of that launcher's running VM ID written to the new
  directory DIR (owner-only, never an existing one; docs/snapshots.md); the
  guest runs on, or with --stop its VM ends (status 0) once it is written.
  POST /vms {"restore": DIR} on the launcher, or pyvmm --restore=DIR,
  resumes it.
"""


def _api_sock(argv: list[str], name: str) -> tuple[str, list[str]]:
    """--api-sock PATH or --api-sock=PATH first; the rest."""
    if argv and argv[0] in ("-h", "--help"):
        return "", []
    if not argv or not argv[0].startswith("--api-sock"):
        raise UsageError(f"{name}: --api-sock PATH is required first (see pyvmm {name} --help)")
    head, eq, value = argv[0].partition("=")
    if head != "--api-sock":
        raise UsageError(f"{name}: Invalid option: `{argv[0]}' (see pyvmm {name} --help)")
    rest = argv[1:]
    if not eq:
        if not rest:
            raise UsageError(f"{name}: --api-sock: missing value (--api-sock=PATH)")
        value, rest = rest[0], rest[1:]
    if not value:
        raise UsageError(f"{name}: --api-sock: missing PATH")
    return value, rest


def main(argv: list[str]) -> int:
    """``argv`` starts with the subcommand; its exit status, its errors
    told as the command's (pyvmm.common.stopping)."""
    return stopping.contained(lambda: _subcommand(argv))


def _subcommand(argv: list[str]) -> int:
    stopping.standard_fds()
    name, args = argv[0], argv[1:]
    path, rest = _api_sock(args, name)
    if not path:
        sys.stdout.write(USAGE)
        return 0
    if name == "serve":
        from pyvmm.serve.limits import parse_limits

        limits = parse_limits(rest)
        from pyvmm.serve.server import serve

        return serve(path, limits)
    from pyvmm.serve.client import ClientError, run, snapshot

    if name == "snapshot":
        try:
            return snapshot(path, rest)
        except ClientError as err:
            raise UsageError(str(err)) from None
    if not rest:
        raise UsageError("Missing KERNEL operand (see pyvmm --help)")
    try:
        return run(path, rest)
    except ClientError as err:
        raise UsageError(str(err)) from None
