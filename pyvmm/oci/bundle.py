"""From an OCI bundle (config.json + rootfs) to a pyvmm command line.

Where the unikernel is, in the order tried (docs/orchestration.md):

1. the annotations ``org.pyvmm.unikernel.binary`` (a path inside the
   rootfs) and ``org.pyvmm.unikernel.type`` (``hvt``, ``solo5-hvt``) in
   config.json, or urunc's ``com.urunc.unikernel.binary`` with
   ``com.urunc.unikernel.hypervisor`` = ``hvt``;
2. the same keys in ``/pyvmm-oci.json`` at the root of the rootfs (a JSON
   object; containerd does not copy an image's labels into config.json, so
   the image tool writes them there too), or urunc's ``/urunc.json``
   (values base64-encoded);
3. ``process.args[0]`` if it is a file in the rootfs;
4. the default path ``/unikernel/kernel.hvt``.

The file must be a Solo5 hvt unikernel (pyvmm's loader reads its notes and
manifest); anything else is refused with one line.

Guest arguments are ``process.args`` without a first element that names
the unikernel (an image's entrypoint), so ``ctr run IMAGE ID 7 x`` and a
Kubernetes ``args:`` both become the guest's ``7 x``. With networking, the
annotation ``org.pyvmm.unikernel.net-args`` is a template (``{ip}``,
``{prefix}``, ``{cidr}``, ``{netmask}``, ``{gateway}``, ``{mac}``,
``{mtu}``, ``{ifname}``) whose words go before them.
``linux.resources.memory.limit`` becomes ``--mem`` (MiB, rounded down).
``org.pyvmm.unikernel.block.NAME`` = a path in the container attaches block
device NAME to that file (a bind mount's source, or the rootfs's file).
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import shlex
from dataclasses import dataclass, field

PREFIX = "org.pyvmm.unikernel."
BINARY = PREFIX + "binary"
TYPE = PREFIX + "type"
NET_ARGS = PREFIX + "net-args"
BLOCK = PREFIX + "block."
URUNC_BINARY = "com.urunc.unikernel.binary"
URUNC_HYPERVISOR = "com.urunc.unikernel.hypervisor"
METADATA = "pyvmm-oci.json"
URUNC_METADATA = "urunc.json"
DEFAULT_PATH = "/unikernel/kernel.hvt"
TYPES = ("hvt", "solo5-hvt", "solo5")


class BundleError(Exception):
    """A bundle pyvmm-oci cannot run (one line for the user)."""


@dataclass
class Unikernel:
    """What create needs from the bundle."""

    path: str  # on the host
    args: list[str]
    devices: list[dict]  # the manifest's, as pyvmm --query-manifest --json
    annotations: dict[str, str]
    mem_mib: int | None = None
    blocks: dict[str, str] = field(default_factory=dict)
    netns: str | None = None  # the path to join
    new_netns: bool = False  # a network namespace without a path: a new one

    @property
    def net_devices(self) -> list[str]:
        return [d["name"] for d in self.devices if d["type"] == "NET_BASIC"]


def load_config(bundle: str) -> dict:
    path = os.path.join(bundle, "config.json")
    try:
        with open(path) as f:
            config = json.load(f)
    except OSError as err:
        raise BundleError(f"cannot read {path}: {err.strerror}") from err
    except ValueError as err:
        raise BundleError(f"{path} is not valid JSON: {err}") from err
    if not isinstance(config, dict):
        raise BundleError(f"{path} is not a JSON object")
    return config


def rootfs_of(bundle: str, config: dict) -> str:
    root = (config.get("root") or {}).get("path") or "rootfs"
    return root if os.path.isabs(root) else os.path.join(bundle, root)


def in_rootfs(rootfs: str, path: str) -> str:
    """``path`` inside the container as a host path (no escape by ``..``)."""
    return os.path.join(rootfs, os.path.normpath("/" + path).lstrip("/"))


def _metadata(rootfs: str) -> dict[str, str]:
    found: dict[str, str] = {}
    path = in_rootfs(rootfs, URUNC_METADATA)
    if os.path.isfile(path):
        try:
            with open(path) as f:
                for key, value in json.load(f).items():
                    try:
                        found[key] = base64.b64decode(value, validate=True).decode()
                    except (binascii.Error, ValueError):
                        found[key] = str(value)
        except (OSError, ValueError, AttributeError) as err:
            raise BundleError(f"/{URUNC_METADATA} in the image is unreadable: {err}") from err
    path = in_rootfs(rootfs, METADATA)
    if os.path.isfile(path):
        try:
            with open(path) as f:
                found.update({k: str(v) for k, v in json.load(f).items()})
        except (OSError, ValueError, AttributeError) as err:
            raise BundleError(f"/{METADATA} in the image is unreadable: {err}") from err
    return found


def _unikernel_path(annotations: dict[str, str], args: list[str]) -> tuple[str | None, str]:
    """The path in the container and where it came from."""
    if annotations.get(BINARY):
        kind = annotations.get(TYPE, "hvt")
        if kind not in TYPES:
            raise BundleError(f"{TYPE}={kind!r}: pyvmm runs Solo5 hvt unikernels only")
        return annotations[BINARY], BINARY
    if annotations.get(URUNC_BINARY):
        hypervisor = annotations.get(URUNC_HYPERVISOR, "hvt")
        if hypervisor not in TYPES:
            raise BundleError(
                f"{URUNC_HYPERVISOR}={hypervisor!r}: pyvmm stands in for solo5-hvt (hvt) only"
            )
        return annotations[URUNC_BINARY], URUNC_BINARY
    return None, ""


def _block_source(config: dict, rootfs: str, path: str) -> str:
    for mount in config.get("mounts") or []:
        if os.path.normpath(mount.get("destination", "")) == os.path.normpath(path):
            if mount.get("source"):
                return mount["source"]
    return in_rootfs(rootfs, path)


def read_bundle(bundle: str, config: dict | None = None) -> Unikernel:
    """Find and check the unikernel, map args, memory, namespaces."""
    from pyvmm.errors import PyvmmError
    from pyvmm.query import describe

    config = load_config(bundle) if config is None else config
    rootfs = rootfs_of(bundle, config)
    process = config.get("process") or {}
    args = [str(a) for a in process.get("args") or []]
    annotations = {**_metadata(rootfs), **(config.get("annotations") or {})}

    inner, source = _unikernel_path(annotations, args)
    if inner is None:
        if args and os.path.isfile(in_rootfs(rootfs, args[0])):
            inner, source = args[0], "process.args[0]"
        elif os.path.isfile(in_rootfs(rootfs, DEFAULT_PATH)):
            inner, source = DEFAULT_PATH, "the default path"
        else:
            what = f"process.args[0] {args[0]!r}" if args else "process.args"
            raise BundleError(
                f"not a unikernel image: no {BINARY} annotation, no /{METADATA}, "
                f"{what} is not a file in the rootfs and there is no {DEFAULT_PATH}"
            )
    path = in_rootfs(rootfs, inner)
    if not os.path.isfile(path):
        raise BundleError(f"not a unikernel image: {inner} (from {source}) is not in the rootfs")
    try:
        devices = describe(path)["devices"]
    except PyvmmError as err:
        msg = str(err).replace(path, inner)
        raise BundleError(f"not a unikernel image: {msg}") from err

    if args and (
        os.path.normpath("/" + args[0]) == os.path.normpath("/" + inner)
        or args[0] == os.path.basename(inner)
    ):
        args = args[1:]

    linux = config.get("linux") or {}
    limit = ((linux.get("resources") or {}).get("memory") or {}).get("limit")
    mem = None
    if isinstance(limit, int) and limit > 0:
        mem = limit >> 20
        if mem < 2:
            raise BundleError(f"memory limit {limit} bytes is below pyvmm's 2 MiB minimum")

    result = Unikernel(path=path, args=args, devices=devices, annotations=annotations, mem_mib=mem)
    for ns in linux.get("namespaces") or []:
        if ns.get("type") == "network":
            if ns.get("path"):
                result.netns = ns["path"]
            else:
                result.new_netns = True
    for key, value in annotations.items():
        if key.startswith(BLOCK):
            result.blocks[key[len(BLOCK) :]] = _block_source(config, rootfs, value)
    if result.net_devices and result.netns is None:
        raise BundleError(
            f"the unikernel declares net device {result.net_devices[0]} but the container "
            "has no network namespace to join (give it one set up by CNI)"
        )
    return result


def net_args(template: str, values: dict[str, str]) -> list[str]:
    """The template's words with the interface's values filled in."""
    try:
        return shlex.split(template.format(**values))
    except (KeyError, IndexError, ValueError) as err:
        raise BundleError(f"{NET_ARGS}={template!r}: bad template ({err})") from err
