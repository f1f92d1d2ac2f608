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
``{mtu}``, ``{ifname}``, plain names only: pyvmm.oci.netargs) whose words
go before them. ``linux.resources`` goes to the container's cgroup
(pyvmm.oci.cgroups); the memory limit less pyvmm's own share becomes
``--mem`` (MiB, rounded down), and a cpuset the CPUs of ``--pin``.
``org.pyvmm.unikernel.block.NAME`` = a path in the container attaches
the unikernel's block device NAME to that file: the source of a bind
mount with that destination (the operator's choice, which may be a host
block device), else a regular file of the rootfs.

Every path the image names is resolved inside the rootfs and opened here
(pyvmm.oci.rootfs); pyvmm gets the descriptors, never the image's paths.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import stat

from pyvmm.oci import netargs, rootfs
from pyvmm.oci.cgroups import CgroupError, Resources
from pyvmm.oci.rootfs import NotInRootfs

PREFIX = "org.pyvmm.unikernel."
BINARY = PREFIX + "binary"
TYPE = PREFIX + "type"
NET_ARGS = PREFIX + "net-args"
BLOCK = PREFIX + "block."
URUNC_BINARY = "com.urunc.unikernel.binary"
URUNC_HYPERVISOR = "com.urunc.unikernel.hypervisor"
METADATA = "pyvmm-oci.json"
URUNC_METADATA = "urunc.json"
METADATA_MAX = 64 * 1024  # bytes of /pyvmm-oci.json or /urunc.json
DEFAULT_PATH = "/unikernel/kernel.hvt"
TYPES = ("hvt", "solo5-hvt", "solo5")
SHOWN = 200  # characters of an image's string quoted in a message
BIND = ("bind", "rbind")


class BundleError(Exception):
    """A bundle pyvmm-oci cannot run (one line for the user)."""


def shown(text: str) -> str:
    """An image's string as a message may quote it: one line, not long."""
    if len(text) <= SHOWN and text.isprintable():
        return text
    cut = text[:SHOWN]
    return repr(cut)[1:-1] + ("..." if len(text) > SHOWN else "")


class Attached:
    """A block device's file, open read-write, and what it is for messages."""

    __slots__ = ("fd", "where")

    def __init__(self, fd: int, where: str) -> None:
        self.fd = fd
        self.where = where


class Unikernel:
    """What create needs from the bundle; owns the descriptors it holds."""

    __slots__ = (
        "inner",
        "fd",
        "args",
        "devices",
        "annotations",
        "mem_mib",
        "resources",
        "cgroups_path",
        "blocks",
        "net_template",
        "netns",
        "new_netns",
        "user",
    )

    def __init__(
        self,
        inner: str,
        fd: int,
        args: list[str],
        devices: list[dict],
        annotations: dict[str, str],
    ) -> None:
        self.inner = inner  # the unikernel's path in the container
        self.fd = fd  # the unikernel, open for reading
        self.args = args
        self.devices = devices  # the manifest's, as pyvmm --query-manifest --json
        self.annotations = annotations
        # Filled in from the rest of the bundle:
        self.mem_mib: int | None = None
        self.resources = Resources()
        self.cgroups_path: str | None = None
        self.blocks: dict[str, Attached] = {}
        self.net_template: netargs.Pieces | None = None
        self.netns: str | None = None  # the path to join
        self.new_netns = False  # a network namespace without a path: a new one
        self.user: tuple[int, int] | None = None  # process.user when not root: pyvmm --user

    @property
    def path(self) -> str:
        """The unikernel as pyvmm opens it: this process's descriptor, which
        the container's process inherits under the same number."""
        return f"/proc/self/fd/{self.fd}"

    @property
    def net_devices(self) -> list[str]:
        return [d["name"] for d in self.devices if d["type"] == "NET_BASIC"]

    @property
    def block_devices(self) -> list[str]:
        return [d["name"] for d in self.devices if d["type"] == "BLOCK_BASIC"]

    def fds(self) -> list[int]:
        """Every descriptor pyvmm gets (they must survive its exec)."""
        return [fd for fd in (self.fd, *(b.fd for b in self.blocks.values())) if fd >= 0]

    def close(self) -> None:
        for fd in self.fds():
            os.close(fd)
        self.fd = -1
        for block in self.blocks.values():
            block.fd = -1

    def __enter__(self) -> Unikernel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _json(data: bytes | str, what: str) -> object:
    try:
        return json.loads(data)
    except RecursionError:
        raise BundleError(f"{what} is nested too deeply") from None
    except ValueError as err:  # also UnicodeDecodeError
        raise BundleError(f"{what} is not valid JSON: {shown(str(err))}") from None


def load_config(bundle: str) -> dict:
    path = os.path.join(bundle, "config.json")
    try:
        with open(path, "rb") as f:
            config = _json(f.read(), path)
    except OSError as err:
        raise BundleError(f"cannot read {path}: {err.strerror}") from err
    if not isinstance(config, dict):
        raise BundleError(f"{path} is not a JSON object")
    return config


def _member(parent: dict, key: str, what: str, kind: type, noun: str):
    """An optional member of JSON type ``kind`` (``noun`` in the error):
    absent or null reads as an empty one."""
    value = parent.get(key)
    if value is None:
        return kind()
    if not isinstance(value, kind):
        raise BundleError(f"config.json: {what} is not {noun}")
    return value


def _object(parent: dict, key: str, what: str) -> dict:
    return _member(parent, key, what, dict, "an object")


def _list(parent: dict, key: str, what: str) -> list:
    return _member(parent, key, what, list, "a list")


def _strings(value: object, what: str) -> dict[str, str]:
    """A JSON object whose values are all strings (an annotation map)."""
    if not isinstance(value, dict):
        raise BundleError(f"{what} is not a JSON object")
    for key, item in value.items():
        if not isinstance(item, str):
            raise BundleError(f"{what}: the value of {shown(key)} is not a string")
    return value


def _text(value: object, what: str) -> str:
    """A string that can become a path or an argument (no NUL)."""
    if not isinstance(value, str):
        raise BundleError(f"config.json: {what} is not a string")
    if "\0" in value:
        raise BundleError(f"config.json: {what} contains a NUL character")
    return value


def _process_user(process: dict) -> tuple[int, int] | None:
    """process.user's uid and gid, None for root (pyvmm keeps its own user).
    A unikernel has no users of its own: the ids are the host process's
    after its devices are open (pyvmm --user=UID:GID, docs/orchestration.md)."""
    from pyvmm.common.values import MAX_ID

    user = _object(process, "user", "process.user")
    ids = []
    for key in ("uid", "gid"):
        value = user.get(key, 0)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_ID:
            raise BundleError(f"config.json: process.user.{key} is not an id (0 to {MAX_ID})")
        ids.append(value)
    uid, gid = ids
    return None if uid == 0 and gid == 0 else (uid, gid)


def rootfs_of(bundle: str, config: dict) -> str:
    root = _text(_object(config, "root", "root").get("path") or "rootfs", "root.path")
    return root if os.path.isabs(root) else os.path.join(bundle, root)


def _metadata(root_fd: int) -> dict[str, str]:
    """The image's own annotations: /urunc.json (base64 values), then
    /pyvmm-oci.json over them."""
    found: dict[str, str] = {}
    for name in (URUNC_METADATA, METADATA):
        what = f"/{name} in the image"
        try:
            data = rootfs.read_file(root_fd, name, METADATA_MAX)
        except NotInRootfs as err:
            raise BundleError(f"{what} {err}") from None
        if data is None:
            continue
        notes = _strings(_json(data, what), what)
        if name == URUNC_METADATA:
            notes = {key: _base64(value) for key, value in notes.items()}
        found.update(notes)
    return found


def _base64(value: str) -> str:
    try:
        return base64.b64decode(value, validate=True).decode()
    except (binascii.Error, ValueError):
        return value


def _unikernel_path(annotations: dict[str, str]) -> tuple[str | None, str]:
    """The path in the container and where it came from."""
    if annotations.get(BINARY):
        kind = annotations.get(TYPE, "hvt")
        if kind not in TYPES:
            raise BundleError(f"{TYPE}={shown(kind)!r}: pyvmm runs Solo5 hvt unikernels only")
        return annotations[BINARY], BINARY
    if annotations.get(URUNC_BINARY):
        hypervisor = annotations.get(URUNC_HYPERVISOR, "hvt")
        if hypervisor not in TYPES:
            raise BundleError(
                f"{URUNC_HYPERVISOR}={shown(hypervisor)!r}: pyvmm stands in for solo5-hvt "
                "(hvt) only"
            )
        return annotations[URUNC_BINARY], URUNC_BINARY
    return None, ""


def _open_kernel(root_fd: int, annotations: dict[str, str], args: list[str]) -> tuple[int, str]:
    """The unikernel open for reading, and its path in the container."""
    inner, source = _unikernel_path(annotations)
    if inner is not None:
        try:
            return rootfs.open_file(root_fd, inner), inner
        except NotInRootfs as err:
            raise BundleError(
                f"not a unikernel image: {shown(inner)} (from {source}) {err}"
            ) from None
    for candidate in [*args[:1], DEFAULT_PATH]:
        try:
            return rootfs.open_file(root_fd, candidate), candidate
        except NotInRootfs:
            continue
    what = f"process.args[0] {shown(args[0])!r}" if args else "process.args"
    raise BundleError(
        f"not a unikernel image: no {BINARY} annotation, no /{METADATA}, "
        f"{what} is not a file in the rootfs and there is no {DEFAULT_PATH}"
    )


def _same_path(a: str, b: str) -> bool:
    return os.path.normpath("/" + a) == os.path.normpath("/" + b)


def _open_mount_source(bundle: str, mount: dict, key: str) -> Attached:
    """A bind mount's source: a host path the operator chose (a file or a
    host block device), opened read-write without a window for a swap."""
    source, kind = mount.get("source"), mount.get("type")
    if isinstance(source, str):
        _text(source, "a mount's source")
    options = mount.get("options") or []
    if not isinstance(options, list) or not all(isinstance(o, str) for o in options):
        raise BundleError(f"{key}: the mount's options are not a list of strings")
    if (
        not isinstance(source, str)
        or not source
        or (kind not in BIND and not set(options) & set(BIND))
    ):
        raise BundleError(f"{key}: the mount at that path is not a bind mount of a file")
    if "ro" in options:
        raise BundleError(
            f"{key}: the mount at that path is read-only (pyvmm attaches block devices read-write)"
        )
    host = source if os.path.isabs(source) else os.path.join(bundle, source)
    try:
        path_fd = os.open(host, os.O_PATH | os.O_CLOEXEC)
    except OSError as err:
        raise BundleError(
            f"{key}: cannot open the mount's source {shown(host)}: {err.strerror}"
        ) from None
    try:
        mode = os.fstat(path_fd).st_mode
        if not (stat.S_ISREG(mode) or stat.S_ISBLK(mode)):
            raise BundleError(
                f"{key}: the mount's source {shown(host)} is not a regular file or block device"
            )
        try:
            fd = rootfs.reopen(path_fd, os.O_RDWR)
        except OSError as err:
            raise BundleError(f"{key}: cannot open {shown(host)}: {err.strerror}") from None
    finally:
        os.close(path_fd)
    return Attached(fd, f"{host} (bind-mounted at {mount.get('destination')})")


def _open_block(bundle: str, config: dict, root_fd: int, key: str, path: str) -> Attached:
    for mount in _list(config, "mounts", "mounts"):
        if isinstance(mount, dict) and isinstance(mount.get("destination"), str):
            if _same_path(mount["destination"], path):
                return _open_mount_source(bundle, mount, key)
    try:
        return Attached(rootfs.open_file(root_fd, path, write=True), f"{path} in the rootfs")
    except NotInRootfs as err:
        raise BundleError(f"{key}={shown(path)}: {shown(path)} {err}") from None


def read_bundle(bundle: str, config: dict | None = None) -> Unikernel:
    """Find, open and check the unikernel and its block files; map args,
    memory, namespaces. The caller owns the result's descriptors."""
    config = load_config(bundle) if config is None else config
    process = _object(config, "process", "process")
    args = [
        _text(arg, f"process.args[{i}]")
        for i, arg in enumerate(_list(process, "args", "process.args"))
    ]
    try:
        root_fd = rootfs.open_root(rootfs_of(bundle, config))
    except OSError as err:
        raise BundleError(f"cannot open the rootfs: {err.strerror}") from None
    try:
        annotations = {
            **_metadata(root_fd),
            **_strings(_object(config, "annotations", "annotations"), "config.json annotations"),
        }
        fd, inner = _open_kernel(root_fd, annotations, args)
        result = Unikernel(inner=inner, fd=fd, args=args, devices=[], annotations=annotations)
        try:
            result.user = _process_user(process)
            _fill(result, bundle, config, root_fd)
        except BaseException:
            result.close()
            raise
    finally:
        os.close(root_fd)
    return result


def _declared_devices(path: str) -> list[dict]:
    """The manifest's devices (name and type, as ``pyvmm --query-manifest
    --json`` lists them), its notes checked as the VM's loader checks
    them, without the query's option column: that imports every device
    kind, which cost create ~8 ms (docs/orchestration.md). ABI version 1
    is refused here, as the VM would refuse it at start: pyvmm-oci never
    passes --legacy-abi, so its message names the remedy that does work."""
    from pyvmm.common.errors import LoaderError
    from pyvmm.loader import Manifest, parse_elf, read_abi, read_capabilities
    from pyvmm.loader.kernel import _read_file

    image = parse_elf(_read_file(path), path)
    if read_abi(image, legacy=True).legacy:
        raise LoaderError(
            f"{path}: built for Solo5's ABI version 1 (Solo5 0.9 or older), which pyvmm-oci "
            "does not run: rebuild it with Solo5 0.10 or later"
        )
    read_capabilities(image)
    entries = Manifest.from_image(image).devices()
    return [{"name": e.name, "type": e.type.solo5_name} for e in entries]


def _fill(result: Unikernel, bundle: str, config: dict, root_fd: int) -> None:
    """Everything after the unikernel is open (which ``result`` holds)."""
    from pyvmm.common.errors import PyvmmError

    try:
        result.devices = _declared_devices(result.path)
    except PyvmmError as err:
        msg = str(err).replace(result.path, shown(result.inner))
        raise BundleError(f"not a unikernel image: {msg}") from err
    args, inner = result.args, result.inner
    if args and (_same_path(args[0], inner) or args[0] == os.path.basename(inner)):
        result.args = args[1:]
    linux = _object(config, "linux", "linux")
    try:
        result.resources = Resources.from_spec(linux.get("resources"))
        result.mem_mib = result.resources.guest_mem_mib()
    except CgroupError as err:
        raise BundleError(str(err)) from None
    if linux.get("cgroupsPath") is not None:
        result.cgroups_path = _text(linux["cgroupsPath"], "linux.cgroupsPath")
    for ns in _list(linux, "namespaces", "linux.namespaces"):
        if isinstance(ns, dict) and ns.get("type") == "network":
            if ns.get("path"):
                result.netns = _text(ns["path"], "the network namespace's path")
            else:
                result.new_netns = True
    template = result.annotations.get(NET_ARGS)
    if template:
        try:
            result.net_template = netargs.parse(template)
        except netargs.TemplateError as err:
            raise BundleError(f"{NET_ARGS}: bad template: {err}") from None
    declared = result.block_devices
    for key, value in sorted(result.annotations.items()):
        if not key.startswith(BLOCK):
            continue
        name = key[len(BLOCK) :]
        if name not in declared:
            listed = ", ".join(declared) or "none"
            raise BundleError(
                f"{shown(key)}: the unikernel declares no block device {shown(name)!r} "
                f"(its block devices: {listed})"
            )
        result.blocks[name] = _open_block(bundle, config, root_fd, shown(key), value)
    if result.net_devices and result.netns is None:
        raise BundleError(
            f"the unikernel declares net device {result.net_devices[0]} but the container "
            "has no network namespace to join (give it one set up by CNI)"
        )


def net_args(template: str, values: dict[str, str]) -> list[str]:
    """The template's words with the interface's values filled in."""
    try:
        return netargs.fill(netargs.parse(template), values)
    except netargs.TemplateError as err:
        raise BundleError(f"{NET_ARGS}: bad template: {err}") from None
