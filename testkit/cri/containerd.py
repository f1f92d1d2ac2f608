"""containerd with its CRI plugin on private directories, inside a network
namespace of its own, for the CRI tests and bench/cri.py.

containerd runs in a namespace made by ``NetNamespace`` (setns between fork
and exec), so the CNI bridge, the pods' veths and the streaming server's
loopback port live there and never in the host's namespace. Its root,
state, socket, CNI configuration, host-local's leases, the pods' network
namespace mounts (``netns_mounts_under_state_dir``) and the runtimes' state
are all below one temporary directory. Two runtime handlers: ``pyvmm``
(io.containerd.runc.v2 with pyvmm-oci as its BinaryName) and ``runc``.
``stop()`` takes everything down whatever the tests left: pods stopped and
removed through the CRI, containerd stopped, any shim or process still
naming the directory killed by pid, mounts under it detached, the pods'
cgroup parent removed, the namespace and the directory removed; it returns
what it had to clean up by force.
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
import uuid
from pathlib import Path
from typing import Any

from pyvmm.oci.cgroups import DEFAULT_ROOT, is_v2
from testkit.containerd import MNT_DETACH, mounts_under, pids_mentioning
from testkit.cri import images, stubs
from testkit.netns import NetNamespace

NAMESPACE = "k8s.io"  # the containerd namespace the CRI plugin works in
POD_SUBNET = "10.88.0.0/24"
POD_GATEWAY = "10.88.0.1"
BRIDGE = "cni0"
CNI_BIN = "/usr/lib/cni"  # Debian's containernetworking-plugins
CNI_RESULTS = "/var/lib/cni/results"  # libcni's cache of ADD results (removed at DEL)
CALL_TIMEOUT = 60.0


class CriError(RuntimeError):
    """containerd did not come up, or a CRI call failed."""


def cgroup_dirs(path: str) -> list[str]:
    """The directories of cgroup ``path`` that exist: v2's one, or one in
    every v1 hierarchy mounted (runc makes the pod's level in all of them,
    blkio, devices, freezer and systemd's included, not only the five
    pyvmm-oci uses)."""
    rel = path.lstrip("/")
    if is_v2():
        bases = [DEFAULT_ROOT]
    else:
        bases = sorted(
            {
                os.path.realpath(os.path.join(DEFAULT_ROOT, name))
                for name in os.listdir(DEFAULT_ROOT)
                if os.path.ismount(os.path.join(DEFAULT_ROOT, name))
            }
        )
    dirs = [os.path.join(base, rel) for base in bases]
    return [d for d in dirs if os.path.isdir(d)]


class Cri:
    """A CRI client: the runtime and image services over containerd's socket."""

    def __init__(self, address: str) -> None:
        import grpc

        self.pb, grpc_stubs = stubs.load()
        self.channel = grpc.insecure_channel(f"unix://{address}")
        self.runtime = grpc_stubs.RuntimeServiceStub(self.channel)
        self.images = grpc_stubs.ImageServiceStub(self.channel)

    def call(self, service: Any, method: str, request: Any, timeout: float = CALL_TIMEOUT) -> Any:
        """One call; a gRPC error becomes a CriError naming the method."""
        import grpc

        try:
            return getattr(service, method)(request, timeout=timeout)
        except grpc.RpcError as err:
            raise CriError(f"{method}: {err.code().name}: {err.details()}") from None

    def rt(self, method: str, **fields: Any) -> Any:
        """A RuntimeService call with a request built from ``fields``."""
        request = getattr(self.pb, f"{method}Request")(**fields)
        return self.call(self.runtime, method, request)

    def close(self) -> None:
        self.channel.close()


class CriContainerd:
    """containerd 1.6+ with the CRI plugin, privately, in its own network namespace."""

    def __init__(self, pyvmm_oci: str, runc: str = "runc") -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="pyvmm-cri-"))
        self.address = str(self.dir / "containerd.sock")
        self.pyvmm_root = self.dir / "pyvmm-oci"
        self.runc_root = self.dir / "runc"
        self.logs = self.dir / "logs"
        self.network = f"pyvmm-cri-{os.getpid()}"
        #: every pod's cgroup goes below this (what kubelet's kubepods is)
        self.cgroup_parent = f"/pyvmm-cri-{os.getpid()}-{self.dir.name[-8:]}"
        self.pyvmm_oci = pyvmm_oci
        self.runc = shutil.which(runc) or runc
        self.ns = NetNamespace()
        self.proc: subprocess.Popen[Any] | None = None
        self.cri: Cri | None = None
        self._log: Any = None
        self._owner = os.getpid()  # a forked child never tears down its parent's

    # -- configuration ----------------------------------------------------

    def config_toml(self) -> str:
        """containerd's configuration (version 2, containerd 1.6/1.7)."""
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        disabled = [
            "io.containerd.internal.v1.tracing",
            "io.containerd.snapshotter.v1.aufs",
            "io.containerd.snapshotter.v1.btrfs",
            "io.containerd.snapshotter.v1.zfs",
            "io.containerd.snapshotter.v1.devmapper",
        ]
        return (
            "version = 2\n"
            f'root = "{self.dir}/root"\nstate = "{self.dir}/state"\n'
            f"disabled_plugins = {json.dumps(disabled)}\n"
            f'[grpc]\n  address = "{self.address}"\n'
            f'[ttrpc]\n  address = "{self.address}.ttrpc"\n'
            '[debug]\n  address = ""\n'
            f"[{cri}]\n"
            f'  sandbox_image = "{images.PAUSE_REF}"\n'
            '  stream_server_address = "127.0.0.1"\n'
            '  stream_server_port = "0"\n'
            "  disable_apparmor = true\n"
            "  restrict_oom_score_adj = true\n"  # no CAP_SYS_RESOURCE in every CI box
            "  netns_mounts_under_state_dir = true\n"
            "  stats_collect_period = 1\n"
            f"[{cri}.cni]\n"
            f'  bin_dir = "{CNI_BIN}"\n  conf_dir = "{self.dir}/cni"\n  max_conf_num = 1\n'
            f"[{cri}.containerd]\n"
            '  snapshotter = "overlayfs"\n  default_runtime_name = "runc"\n'
            f"[{cri}.containerd.runtimes.runc]\n"
            '  runtime_type = "io.containerd.runc.v2"\n'
            f"[{cri}.containerd.runtimes.runc.options]\n"
            f'  BinaryName = "{self.runc}"\n  Root = "{self.runc_root}"\n'
            f"[{cri}.containerd.runtimes.pyvmm]\n"
            '  runtime_type = "io.containerd.runc.v2"\n'
            '  pod_annotations = ["org.pyvmm.unikernel.*"]\n'
            f"[{cri}.containerd.runtimes.pyvmm.options]\n"
            f'  BinaryName = "{self.pyvmm_oci}"\n  Root = "{self.pyvmm_root}"\n'
        )

    def cni_conflist(self) -> dict[str, Any]:
        """bridge + host-local: pods on POD_SUBNET behind BRIDGE, the gateway
        on the bridge, leases kept below the private directory, no NAT."""
        return {
            "cniVersion": "1.0.0",
            "name": self.network,
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": BRIDGE,
                    "isGateway": True,
                    "ipMasq": False,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": POD_SUBNET, "gateway": POD_GATEWAY}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": str(self.dir / "ipam"),
                    },
                }
            ],
        }

    # -- life -------------------------------------------------------------

    def start(self, images_to_import: list[Path] = ()) -> None:
        """Start containerd in the namespace, wait for the CRI, import the
        pause image (built here) and ``images_to_import``."""
        for tool in ("bridge", "host-local", "loopback"):
            if not os.access(os.path.join(CNI_BIN, tool), os.X_OK):
                raise CriError(f"{CNI_BIN}/{tool} is missing (containernetworking-plugins)")
        (self.dir / "cni").mkdir()
        (self.dir / "cni" / "10-pyvmm.conflist").write_text(json.dumps(self.cni_conflist()))
        config = self.dir / "config.toml"
        config.write_text(self.config_toml())
        self.logs.mkdir()
        self.ns.create()
        self._log = open(self.dir / "containerd.log", "w")  # noqa: SIM115
        self.proc = self.ns.popen(
            [shutil.which("containerd") or "containerd", "--config", str(config)],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        self.cri = Cri(self.address)
        deadline = time.monotonic() + 30
        while True:
            try:
                self.cri.call(self.cri.runtime, "Version", self.cri.pb.VersionRequest(), 2)
                break
            except CriError as err:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise CriError(
                        f"containerd's CRI did not answer ({err}): {self.log()}"
                    ) from None
                time.sleep(0.1)
        pause = images.static_image(images.PAUSE_C, "pause", images.PAUSE_REF, self.dir)
        for archive in [pause, *images_to_import]:
            self.ctr("images", "import", str(archive))

    def log(self) -> str:
        """containerd's log's end."""
        with contextlib.suppress(OSError), open(self.dir / "containerd.log") as f:
            return f.read()[-3000:]
        return ""

    def ctr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """``ctr`` in the CRI's namespace."""
        argv = [shutil.which("ctr") or "ctr", "--address", self.address, "-n", NAMESPACE, *args]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=CALL_TIMEOUT)
        if check and done.returncode != 0:
            raise CriError(f"ctr {' '.join(args)}: {done.returncode}: {done.stderr.strip()}")
        return done

    def stop(self) -> list[str]:
        """Everything goes; the list says what needed force (empty: a clean end)."""
        if os.getpid() != self._owner:
            return []
        forced: list[str] = []
        steps = [
            lambda: self._remove_pods(forced),
            self._stop_containerd,
            lambda: self._kill_leftovers(forced),
            lambda: self._detach_mounts(forced),
            lambda: self._remove_cgroups(forced),
            self.ns.close,
        ]
        for step in steps:
            try:
                step()
            except Exception as err:  # keep cleaning up
                forced.append(f"{getattr(step, '__name__', 'step')}: {err!r}")
        if self._log is not None:
            self._log.close()
        shutil.rmtree(self.dir, ignore_errors=True)
        return forced

    # -- teardown steps ---------------------------------------------------

    def _remove_pods(self, forced: list[str]) -> None:
        if self.cri is None:
            return
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(CriError):
                for pod in self.cri.rt("ListPodSandbox").items:
                    forced.append(f"pod {pod.metadata.name} was still there")
                    with contextlib.suppress(CriError):
                        self.cri.rt("StopPodSandbox", pod_sandbox_id=pod.id)
                    with contextlib.suppress(CriError):
                        self.cri.rt("RemovePodSandbox", pod_sandbox_id=pod.id)
        self.cri.close()

    def _stop_containerd(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def _kill_leftovers(self, forced: list[str]) -> None:
        # Shims, pause processes and guests of this containerd name its directory.
        for pid in pids_mentioning(str(self.dir)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                forced.append(f"pid {pid} was still running")

    def _detach_mounts(self, forced: list[str]) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        for point in mounts_under(str(self.dir)):
            if libc.umount2(point.encode(), MNT_DETACH) == 0:
                forced.append(f"{point} was still mounted")

    def _remove_cgroups(self, forced: list[str]) -> None:
        """The pods' parent, as kubelet removes its own; anything below it
        is a leftover (killed, then removed)."""
        for top in cgroup_dirs(self.cgroup_parent):
            for here, subdirs, _ in os.walk(top, topdown=False):
                for sub in subdirs:
                    path = os.path.join(here, sub)
                    forced.append(f"cgroup {path} was left")
                    _rmdir_cgroup(path)
            _rmdir_cgroup(top)

    # -- pods -------------------------------------------------------------

    def run_pod(self, name: str, handler: str) -> Pod:
        """RunPodSandbox with ``handler``: CNI networking, logs below
        ``logs/UID``, its cgroup ``cgroup_parent/podUID`` (kubelet's layout)."""
        assert self.cri is not None, "start() first"
        pb = self.cri.pb
        uid = uuid.uuid4().hex
        config = pb.PodSandboxConfig(
            metadata=pb.PodSandboxMetadata(name=name, uid=uid, namespace="default"),
            hostname=name,
            log_directory=str(self.logs / uid),
            linux=pb.LinuxPodSandboxConfig(cgroup_parent=f"{self.cgroup_parent}/pod{uid}"),
        )
        pod_id = self.cri.rt("RunPodSandbox", config=config, runtime_handler=handler)
        return Pod(self, pod_id.pod_sandbox_id, config)


class Pod:
    """A pod sandbox and the containers made in it through the CRI."""

    def __init__(self, ctd: CriContainerd, pod_id: str, config: Any) -> None:
        assert ctd.cri is not None
        self.ctd, self.cri, self.id, self.config = ctd, ctd.cri, pod_id, config
        self.uid = config.metadata.uid
        self.cgroup = config.linux.cgroup_parent

    def status(self) -> Any:
        return self.cri.rt("PodSandboxStatus", pod_sandbox_id=self.id).status

    def create(self, name: str, image: str, args: list[str] | None = None) -> str:
        """CreateContainer: ``image`` with ``args``, its log at ``NAME.log``."""
        pb = self.cri.pb
        config = pb.ContainerConfig(
            metadata=pb.ContainerMetadata(name=name),
            image=pb.ImageSpec(image=image),
            args=list(args or []),
            log_path=f"{name}.log",
        )
        done = self.cri.rt(
            "CreateContainer", pod_sandbox_id=self.id, config=config, sandbox_config=self.config
        )
        return done.container_id

    def start(self, container_id: str) -> None:
        self.cri.rt("StartContainer", container_id=container_id)

    def container(self, container_id: str) -> Any:
        """ContainerStatus's status."""
        return self.cri.rt("ContainerStatus", container_id=container_id).status

    def info(self, container_id: str) -> dict[str, Any]:
        """The verbose ContainerStatus's ``info`` (the pid, the runtime spec)."""
        done = self.cri.rt("ContainerStatus", container_id=container_id, verbose=True)
        return json.loads(done.info["info"])

    def wait_exited(self, container_id: str, timeout: float = 30) -> Any:
        """ContainerStatus once the container has exited."""
        deadline = time.monotonic() + timeout
        while True:
            status = self.container(container_id)
            if status.state == self.cri.pb.CONTAINER_EXITED:
                return status
            if time.monotonic() > deadline:
                state = self.cri.pb.ContainerState.Name(status.state)
                raise CriError(f"container {container_id[:12]} still {state} after {timeout} s")
            time.sleep(0.05)

    def log_path(self, name: str) -> Path:
        return Path(self.config.log_directory) / f"{name}.log"

    def remove(self) -> None:
        """StopPodSandbox, RemovePodSandbox, then the pod's cgroup as kubelet
        removes it: it must be empty by then (the runtimes removed theirs)."""
        self.cri.rt("StopPodSandbox", pod_sandbox_id=self.id)
        self.cri.rt("RemovePodSandbox", pod_sandbox_id=self.id)
        for path in cgroup_dirs(self.cgroup):
            children = [d for d in os.listdir(path) if os.path.isdir(os.path.join(path, d))]
            if children:
                raise CriError(f"cgroup {path} still holds {children} after RemovePodSandbox")
            os.rmdir(path)


def _rmdir_cgroup(path: str) -> None:
    """Kill what is inside a cgroup directory and remove it."""
    deadline = time.monotonic() + 5
    while True:
        with contextlib.suppress(OSError), open(os.path.join(path, "cgroup.procs")) as f:
            for pid in f.read().split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
