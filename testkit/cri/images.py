"""Linux images made on the spot, since no registry is reachable: a pod's
sandbox (pause) program and runc's static hello, each a static C program
compiled at run time (``gcc -static``) and packed as a one-layer OCI image
archive for ``ctr images import``.
"""

from __future__ import annotations

import hashlib
import io
import subprocess
import tarfile
from pathlib import Path

from pyvmm.oci.image import CONFIG, LAYER, MANIFEST, _add, _descriptor, _dir, _json

#: Waits for the stop signal the CRI plugin sends (SIGTERM; SIGINT too), as
#: Kubernetes' pause does, and reaps nothing: the pod's other containers are
#: unikernels in their own processes.
PAUSE_C = r"""
#include <signal.h>
#include <unistd.h>
static void stop(int sig) { (void)sig; _exit(0); }
int main(void) {
    signal(SIGTERM, stop);
    signal(SIGINT, stop);
    for (;;) pause();
}
"""

#: What runc runs beside the hello unikernel in bench/cri.py: its output, then exit 0.
HELLO_C = r"""
#include <unistd.h>
int main(void) {
    static const char text[] = "Hello, world\n";
    return write(1, text, sizeof text - 1) == sizeof text - 1 ? 0 : 1;
}
"""

PAUSE_REF = "pyvmm.test/pause:local"
HELLO_REF = "pyvmm.test/static-hello:local"


def compile_static(source: str, out: Path) -> Path:
    """``gcc -static -O2`` of ``source`` into ``out``."""
    src = out.with_suffix(".c")
    src.write_text(source)
    done = subprocess.run(
        ["gcc", "-static", "-O2", "-o", str(out), str(src)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if done.returncode != 0:
        raise RuntimeError(f"gcc -static {src}: {done.stderr.strip()}")
    return out


def pack_program(binary: Path, archive: Path, ref: str) -> str:
    """An OCI image archive whose one layer holds ``binary`` as ``/NAME``,
    its entrypoint; returns ``ref``, the name ``ctr images import`` gives it."""
    inner = "/" + binary.name
    layer_buf = io.BytesIO()
    with tarfile.open(fileobj=layer_buf, mode="w", format=tarfile.PAX_FORMAT) as layer:
        _add(layer, inner.lstrip("/"), binary.read_bytes(), 0o755)
    layer_data = layer_buf.getvalue()
    layer_desc = _descriptor(LAYER, layer_data)
    config_data = _json(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Entrypoint": [inner]},
            "rootfs": {"type": "layers", "diff_ids": [layer_desc["digest"]]},
        }
    )
    manifest_data = _json(
        {
            "schemaVersion": 2,
            "mediaType": MANIFEST,
            "config": _descriptor(CONFIG, config_data),
            "layers": [layer_desc],
        }
    )
    index = {
        "schemaVersion": 2,
        "manifests": [
            {
                **_descriptor(MANIFEST, manifest_data),
                "platform": {"architecture": "amd64", "os": "linux"},
                "annotations": {"io.containerd.image.name": ref},
            }
        ],
    }
    with tarfile.open(archive, "w", format=tarfile.PAX_FORMAT) as tar:
        _add(tar, "oci-layout", _json({"imageLayoutVersion": "1.0.0"}))
        _dir(tar, "blobs")
        _dir(tar, "blobs/sha256")
        for data in (layer_data, config_data, manifest_data):
            _add(tar, "blobs/sha256/" + hashlib.sha256(data).hexdigest(), data)
        _add(tar, "index.json", _json(index))
    return ref


def static_image(source: str, name: str, ref: str, workdir: Path) -> Path:
    """Compile ``source`` as ``workdir/NAME`` and pack it; the archive's path."""
    binary = compile_static(source, workdir / name)
    archive = workdir / f"{name}.tar"
    pack_program(binary, archive, ref)
    return archive
