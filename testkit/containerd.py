"""A private containerd for tests and benchmarks: its own --root, --state,
socket and configuration (the CRI plugin off), never the host's.

``Containerd(runtime).start()`` runs it; ``ctr``, ``run`` and ``run_argv``
drive it (``ctr run --rm --runc-binary RUNTIME --runc-root DIR``); ``stop``
takes everything down whatever state it is in: tasks and containers
deleted, containerd stopped, any shim or guest still naming its directory
killed by pid, their mounts detached, the directory removed (it returns
what had to be killed).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable

CTR_TIMEOUT = 60
MNT_DETACH = 2


def find_tool(name: str) -> str:
    """A tool's path; missing, one line (scripts/setup installs them)."""
    path = shutil.which(name)
    if path is None:
        raise SystemExit(f"{name} is not installed (scripts/setup installs it)")
    return path


def pids_mentioning(text: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdecimal() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if text.encode() in f.read():
                    found.append(int(entry))
        except OSError:
            continue
    return found


def mounts_under(path: str) -> list[str]:
    with open("/proc/self/mountinfo") as f:
        points = [line.split()[4] for line in f]
    return sorted((p for p in points if p.startswith(path + "/")), key=len, reverse=True)


class Containerd:
    """containerd on private directories; ``ctr`` against it."""

    def __init__(
        self,
        runtime: str,
        tool: Callable[[str], str] = find_tool,
        env: dict[str, str] | None = None,
        log_level: str | None = None,
    ) -> None:
        """``runtime``: the --runc-binary of run(); ``tool`` finds containerd
        and ctr (a test's skips, a benchmark's one line); ``env``: more of
        containerd's environment (its shims' and runtimes' too)."""
        self.dir = tempfile.mkdtemp(prefix="pyvmm-oci-")
        self.address = os.path.join(self.dir, "containerd.sock")
        self.runc_root = os.path.join(self.dir, "runc")
        self.trace = os.path.join(self.dir, "trace.log")
        self.runtime = runtime
        self.tool = tool
        self.env = env or {}
        self.log_level = log_level
        self.proc: subprocess.Popen | None = None
        self.log = None

    def start(self) -> None:
        config = os.path.join(self.dir, "config.toml")
        disabled = [
            "io.containerd.grpc.v1.cri",
            "io.containerd.internal.v1.tracing",
            "io.containerd.snapshotter.v1.aufs",
            "io.containerd.snapshotter.v1.btrfs",
            "io.containerd.snapshotter.v1.zfs",
            "io.containerd.snapshotter.v1.devmapper",
        ]
        with open(config, "w") as f:
            f.write(
                "version = 2\n"
                f'root = "{self.dir}/root"\nstate = "{self.dir}/state"\n'
                f"disabled_plugins = {json.dumps(disabled)}\n"
                f'[grpc]\n  address = "{self.address}"\n'
                f'[ttrpc]\n  address = "{self.address}.ttrpc"\n'
                '[debug]\n  address = ""\n'
            )
        self.log = open(os.path.join(self.dir, "containerd.log"), "w")  # noqa: SIM115
        env = dict(os.environ, PYVMM_OCI_TRACE=self.trace, **self.env)
        level = ["--log-level", self.log_level] if self.log_level else []
        self.proc = subprocess.Popen(
            [self.tool("containerd"), "--config", config, *level],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        deadline = time.monotonic() + 30
        while self.ctr("version", check=False).returncode != 0:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"containerd did not start: {self.containerd_log()}")
            time.sleep(0.1)

    def containerd_log(self) -> str:
        with open(os.path.join(self.dir, "containerd.log")) as f:
            return f.read()[-3000:]

    def ctr_argv(self, *args: str) -> list[str]:
        return [self.tool("ctr"), "--address", self.address, *args]

    def ctr(self, *args: str, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
        done = subprocess.run(
            self.ctr_argv(*args), capture_output=True, text=True, timeout=CTR_TIMEOUT, **kwargs
        )
        if check and done.returncode != 0:
            raise AssertionError(f"ctr {' '.join(args)}: {done.returncode}: {done.stderr}")
        return done

    def run_argv(
        self,
        ref: str,
        cid: str,
        *args: str,
        options: tuple[str, ...] = (),
        runtime: str | None = None,
        runc_root: str | None = None,
    ) -> list[str]:
        """``ctr run --rm`` through ``runtime`` (the one given at start by
        default) with its state under ``runc_root``."""
        return self.ctr_argv(
            "run",
            "--rm",
            "--runc-binary",
            runtime or self.runtime,
            "--runc-root",
            runc_root or self.runc_root,
            *options,
            ref,
            cid,
            *args,
        )

    def run(self, ref: str, cid: str, *args: str, options=()) -> subprocess.CompletedProcess:
        return subprocess.run(
            self.run_argv(ref, cid, *args, options=options),
            capture_output=True,
            text=True,
            timeout=CTR_TIMEOUT,
        )

    def containers(self) -> list[str]:
        """What pyvmm-oci still keeps state for."""
        path = os.path.join(self.runc_root, "default")
        return sorted(os.listdir(path)) if os.path.isdir(path) else []

    def stop(self) -> None:
        """Everything goes, whatever state the tests left it in."""
        errors = []
        if self.proc is not None and self.proc.poll() is None:
            for line in self.ctr("task", "ls", "-q", check=False).stdout.split():
                self.ctr("task", "kill", "-s", "SIGKILL", line, check=False)
                self.ctr("task", "delete", "-f", line, check=False)
            for line in self.ctr("container", "ls", "-q", check=False).stdout.split():
                self.ctr("container", "delete", line, check=False)
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        # Shims and guests of this containerd: only they name its directory.
        for pid in pids_mentioning(self.dir):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                errors.append(f"pid {pid} was still running")
        libc = ctypes.CDLL(None, use_errno=True)
        for point in mounts_under(self.dir):
            libc.umount2(point.encode(), MNT_DETACH)
        if self.log is not None:
            self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)
        return errors
