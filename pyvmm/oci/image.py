"""Pack a Solo5 hvt unikernel into an OCI image archive.

    pyvmm-oci pack [--name REF] [--net-args TEMPLATE]
        [--annotation KEY=VALUE]... -o OUT.tar KERNEL [ARG...]

(also ``python3 -m pyvmm.oci.image``)

The archive is an OCI image layout in a tar (``oci-layout``,
``index.json``, ``blobs/sha256/...``) holding one manifest, its config and
one uncompressed layer with two files: the unikernel at
``/unikernel/NAME`` and ``/pyvmm-oci.json``, the annotations that tell
pyvmm-oci what to run (``org.pyvmm.unikernel.binary``, ``.type``, and
``.net-args`` if given). The same annotations are the manifest's
annotations and the config's labels, for tools that read those. The
config's entrypoint is the unikernel and its cmd the ARGs (the guest's
default arguments). ``ctr image import OUT.tar`` loads it as REF
(default ``docker.io/pyvmm/NAME:latest``, NAME the kernel's file name
without ``.hvt``).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import sys
import tarfile
from collections.abc import Sequence

from pyvmm.oci import netargs
from pyvmm.oci.bundle import BINARY, METADATA, NET_ARGS, TYPE

MANIFEST = "application/vnd.oci.image.manifest.v1+json"
CONFIG = "application/vnd.oci.image.config.v1+json"
LAYER = "application/vnd.oci.image.layer.v1.tar"


def _add(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), mode, 0
    tar.addfile(info, io.BytesIO(data))


def _dir(tar: tarfile.TarFile, name: str) -> None:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, 0
    tar.addfile(info)


def _json(obj: object) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def _descriptor(media_type: str, data: bytes) -> dict:
    return {
        "mediaType": media_type,
        "digest": "sha256:" + hashlib.sha256(data).hexdigest(),
        "size": len(data),
    }


def build(
    kernel: str,
    out: str,
    *,
    name: str | None = None,
    args: list[str] | None = None,
    net_args: str | None = None,
    annotations: dict[str, str] | None = None,
    members: Sequence[tuple[tarfile.TarInfo, bytes]] = (),
) -> str:
    """Write the archive; return the image reference it carries.

    ``members``: more entries for the layer (a disk image for a block
    annotation; the tests' links and device nodes)."""
    from pyvmm.command.query import describe

    describe(kernel)  # a Solo5 hvt unikernel, or a LoaderError
    if net_args:
        netargs.parse(net_args)  # what pyvmm-oci would refuse, refused now
    base = os.path.basename(kernel)
    short = base[:-4] if base.endswith(".hvt") else base
    ref = name or f"docker.io/pyvmm/{short}:latest"
    inner = f"/unikernel/{base}"
    notes = {BINARY: inner, TYPE: "hvt"}
    if net_args:
        notes[NET_ARGS] = net_args
    notes.update(annotations or {})

    layer_buf = io.BytesIO()
    with tarfile.open(fileobj=layer_buf, mode="w", format=tarfile.PAX_FORMAT) as layer:
        _dir(layer, "unikernel")
        with open(kernel, "rb") as f:
            _add(layer, inner.lstrip("/"), f.read(), 0o755)
        _add(layer, METADATA, _json(notes))
        for info, data in members:
            layer.addfile(info, io.BytesIO(data) if info.isfile() else None)
    layer_data = layer_buf.getvalue()
    layer_desc = _descriptor(LAYER, layer_data)

    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Entrypoint": [inner], "Cmd": list(args or []), "Labels": notes},
        "rootfs": {"type": "layers", "diff_ids": [layer_desc["digest"]]},
        "history": [{"created_by": "pyvmm-oci pack"}],
    }
    config_data = _json(config)
    manifest = {
        "schemaVersion": 2,
        "mediaType": MANIFEST,
        "config": _descriptor(CONFIG, config_data),
        "layers": [layer_desc],
        "annotations": notes,
    }
    manifest_data = _json(manifest)
    index = {
        "schemaVersion": 2,
        "manifests": [
            {
                **_descriptor(MANIFEST, manifest_data),
                "platform": {"architecture": "amd64", "os": "linux"},
                "annotations": {
                    "io.containerd.image.name": ref,
                    "org.opencontainers.image.ref.name": ref.rsplit(":", 1)[-1],
                },
            }
        ],
    }
    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tar:
        _add(tar, "oci-layout", _json({"imageLayoutVersion": "1.0.0"}))
        _dir(tar, "blobs")
        _dir(tar, "blobs/sha256")
        for data in (layer_data, config_data, manifest_data):
            _add(tar, "blobs/sha256/" + hashlib.sha256(data).hexdigest(), data)
        _add(tar, "index.json", _json(index))
    return ref


PROG = "pyvmm-oci pack"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Pack a Solo5 hvt unikernel into an OCI image archive (ctr image import).",
    )
    p.add_argument("kernel", metavar="KERNEL", help="the Solo5 hvt unikernel")
    p.add_argument("args", nargs="*", metavar="ARG", help="the guest's default arguments")
    p.add_argument("-o", "--output", required=True, metavar="OUT.tar", help="archive to write")
    p.add_argument("--name", metavar="REF", help="default: docker.io/pyvmm/NAME:latest")
    p.add_argument("--net-args", metavar="TEMPLATE", help="guest network arguments, e.g. '{ip}'")
    p.add_argument(
        "--annotation", action="append", default=[], metavar="KEY=VALUE", help="one more"
    )
    opts = p.parse_intermixed_args(argv)
    extra = {}
    for item in opts.annotation:
        key, sep, value = item.partition("=")
        if not sep:
            p.error(f"--annotation {item!r}: KEY=VALUE expected")
        extra[key] = value
    from pyvmm.common.errors import PyvmmError

    try:
        ref = build(
            opts.kernel,
            opts.output,
            name=opts.name,
            args=opts.args,
            net_args=opts.net_args,
            annotations=extra,
        )
    except (PyvmmError, OSError) as err:
        print(f"{PROG}: {err}", file=sys.stderr)
        return 1
    except netargs.TemplateError as err:
        print(f"{PROG}: --net-args: {err}", file=sys.stderr)
        return 1
    print(ref)
    return 0


if __name__ == "__main__":
    sys.exit(main())
