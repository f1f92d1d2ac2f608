"""pyvmm-oci's warm path, the launcher's side: a container's VM prepared
from its bundle in a running ``pyvmm serve``, held until ``start``.

The native front end's ``create`` (csrc/oci_front.c) forks a small relay
process, whose pid goes to the shim's pid file. The relay asks the
launcher (``POST /v1/containers``) for the container's VM; the launcher
calls ``prepare`` here, in its own already warm interpreter: the bundle
read and checked as the cold create reads it (pyvmm.oci.bundle: the
unikernel opened inside the rootfs), the state directory and the cgroup
made, pyvmm's command line built. The launcher forks the VM, which sets
itself up to right before its first instruction and waits; ``join`` moves
it into the container's cgroup at once, ``ready`` the relay too, and
writes the state the other verbs read (state.json, the native summary,
the FIFO). ``start`` takes the relay's byte from the FIFO, as it takes the
cold init's; only then does the relay send ``POST /v1/vms/ID/start`` with
the container's stdio, and the guest runs.

What the warm path does not take (``Refused(cold=True)``: the front end
falls back to the cold create, with a line in the shim's log): a guest
with a net or block device (the tap and the disks are opened in the
container's namespace and rootfs by the cold path) and a pod's sandbox.
"""

from __future__ import annotations

import contextlib
import os

from pyvmm.oci import cgroups, timeline
from pyvmm.oci.bundle import BundleError, Unikernel, load_config, read_bundle
from pyvmm.oci.runtime import (
    DIR_MODE,
    SANDBOX_KEYS,
    Container,
    RuntimeError_,
    _remove,
    _start_time,
    new_state,
    pyvmm_argv,
    pyvmm_command,
)

#: The request's members (POST /v1/containers).
KEYS = frozenset({"bundle", "id", "root", "vm", "systemd_cgroup", "debug"})


class Refused(Exception):
    """One line for the shim; ``cold``: the cold create can start it."""

    def __init__(self, line: str, cold: bool = False) -> None:
        super().__init__(line)
        self.cold = cold


def _text(body: dict, key: str) -> str:
    value = body.get(key)
    if not isinstance(value, str) or not value or "\0" in value:
        raise Refused(f'"{key}" must be a non-empty string')
    return value


def _absolute(body: dict, key: str) -> str:
    value = _text(body, key)
    if not value.startswith("/") or len(value) > 4095:
        raise Refused(f'"{key}" must be an absolute path')
    return value


def _flag(body: dict, key: str) -> bool:
    value = body.get(key, False)
    if not isinstance(value, bool):
        raise Refused(f'"{key}" must be true or false')
    return value


class WarmContainer:
    """One container on its way through the launcher: its state (as the
    cold create writes it), its cgroup and pyvmm's command line."""

    def __init__(self, container: Container, state: dict, kernel: Unikernel, debug: bool) -> None:
        self.container = container
        self.state = state
        self.kernel = kernel
        self.debug = debug
        self.cgroup: cgroups.Cgroup | None = None
        #: pyvmm's command line, after ``pyvmm``: the launcher parses it.
        trace = timeline.vm_trace(container.dir)  # the container's timeline, if it keeps one
        argv = pyvmm_argv(kernel, None, None, verbose=debug, trace=trace)
        self.argv = argv[len(pyvmm_command()) :]

    def pool_key(self) -> tuple | None:
        """What a VM prepared ahead must share with this container's to be
        its: the unikernel's bytes (their digest: each container's rootfs
        is a mount of its own) and pyvmm's command line but the kernel's
        path; None for a VM that is the container's alone (its --trace)."""
        import hashlib

        at = self.argv.index("--")
        options, args = self.argv[:at], self.argv[at + 2 :]
        if any(option.startswith("--trace") for option in options):
            return None
        digest, offset = hashlib.sha256(), 0
        while chunk := os.pread(self.kernel.fd, 1 << 20, offset):
            digest.update(chunk)
            offset += len(chunk)
        return (digest.hexdigest(), tuple(options), tuple(args))

    def image_copy(self) -> int:
        """The unikernel's bytes in a sealed memfd of the launcher's own: a
        pool's VMs outlive this container, and a descriptor of its rootfs
        would keep the rootfs's mount busy (containerd could not unmount it)."""
        import fcntl

        fd = os.memfd_create("pyvmm-oci-image", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            offset = 0
            while chunk := os.pread(self.kernel.fd, 1 << 20, offset):
                os.write(fd, chunk)
                offset += len(chunk)
            seals = fcntl.F_SEAL_WRITE | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def pool_argv(self, fd: int) -> list[str]:
        """This command line with the unikernel at the launcher's ``fd``."""
        at = self.argv.index("--")
        return [*self.argv[: at + 1], f"/proc/self/fd/{fd}", *self.argv[at + 2 :]]

    def close(self) -> None:
        """The launcher's descriptors of the unikernel: its plan has read it."""
        self.kernel.close()

    def join(self, vm_pid: int) -> None:
        """The VM's process (every thread) into the container's cgroup,
        right after its fork: its set-up is charged there."""
        assert self.cgroup is not None
        try:
            self.cgroup.join(vm_pid)
        except cgroups.CgroupError as err:
            raise Refused(str(err)) from None

    def ready(self, vm_id: str, vm_pid: int, relay_pid: int) -> None:
        """The VM waits for its start: the relay joins the cgroup (the shim
        finds the cgroup from the pid it reaps), and the state the other
        verbs read is written, the FIFO last but one."""
        assert self.cgroup is not None
        try:
            self.cgroup.join(relay_pid)
        except cgroups.CgroupError as err:
            raise Refused(str(err)) from None
        state = self.state
        state["pid"] = relay_pid
        state["start_time"] = _start_time(relay_pid)
        state["warm"] = {"vm": vm_id, "pid": vm_pid, "start_time": _start_time(vm_pid)}
        state["argv"] = self.argv
        try:
            with contextlib.suppress(FileExistsError):
                os.mkfifo(self.container.fifo, 0o600)
            self.container.save(state)
            self.container.save_native(state)
        except OSError as err:
            raise Refused(f"the container's state: {err.strerror}") from None

    def remove(self) -> None:
        """A create that did not get through: nothing of it stays."""
        with contextlib.suppress(Exception):
            _remove(self.container, self.state, kill=False)


def prepare(body: dict) -> WarmContainer:
    """A warm create's request -> the container, its cgroup made (no
    process in it yet), or Refused."""
    unknown = sorted(set(body) - KEYS)
    if unknown:
        raise Refused(f"unknown key {unknown[0]!r} (known: {', '.join(sorted(KEYS))})")
    bundle, root = _absolute(body, "bundle"), _absolute(body, "root")
    systemd, debug = _flag(body, "systemd_cgroup"), _flag(body, "debug")
    try:
        container = Container(root, _text(body, "id"))
    except RuntimeError_ as err:
        raise Refused(str(err)) from None
    if os.path.lexists(container.dir):
        raise Refused(f"container {container.id} already exists")
    try:
        config = load_config(bundle)
        annotations = config.get("annotations") or {}
        if isinstance(annotations, dict) and any(
            annotations.get(key) == "sandbox" for key in SANDBOX_KEYS
        ):
            raise Refused("a pod's sandbox is runc's", cold=True)
        # The annotation only: the environment is the launcher's, not the runtime's.
        trace_dir = timeline.requested(annotations, environ={})
        kernel = read_bundle(bundle, config)
    except (BundleError, timeline.TimelineError) as err:
        raise Refused(str(err)) from None
    try:
        if kernel.net_devices or kernel.blocks:
            what = "net" if kernel.net_devices else "block"
            raise Refused(f"the warm path takes guests without {what} devices", cold=True)
        if kernel.user is not None:  # the launcher's VMs run as the launcher's user
            raise Refused("the warm path takes no process.user other than root", cold=True)
        os.makedirs(root, mode=DIR_MODE, exist_ok=True)
        os.mkdir(container.dir, DIR_MODE)
        if trace_dir is not None:
            timeline.start(container.dir, timeline.destination(trace_dir, container.id))
    except BaseException:
        kernel.close()
        raise
    state = new_state(container.id, bundle, config, kernel)
    warm = WarmContainer(container, state, kernel, debug)
    try:
        container.save(state)
        path = cgroups.spec_path(kernel.cgroups_path, container.id, systemd)
        warm.cgroup = cgroups.create(path, kernel.resources)
        state["cgroup"] = warm.cgroup.to_state()
        container.save(state)
    except BaseException as err:
        warm.close()
        warm.remove()
        if isinstance(err, (cgroups.CgroupError, OSError)):
            raise Refused(str(err)) from None
        raise
    return warm
