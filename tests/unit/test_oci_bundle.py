"""pyvmm-oci's reading of a bundle and the image tool, without containerd
(tests/test_oci.py runs both under the real one)."""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import sys
import tarfile

import pytest

from conftest import guest
from pyvmm.oci import image as oci_image
from pyvmm.oci.bundle import BundleError, net_args, read_bundle
from pyvmm.oci.network import Link, tap_name
from pyvmm.oci.runtime import parse_signal, pyvmm_argv, pyvmm_command


def make_bundle(tmp_path, kernel="hello", at="/unikernel/kernel.hvt", **config):
    rootfs = tmp_path / "rootfs"
    if kernel:
        dest = rootfs / at.lstrip("/")
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(guest(kernel), dest)
    rootfs.mkdir(exist_ok=True)
    spec = {"ociVersion": "1.0.2", "root": {"path": "rootfs"}, "process": {"args": []}}
    spec.update(config)
    (tmp_path / "config.json").write_text(json.dumps(spec))
    return tmp_path


@pytest.mark.parametrize(
    ("args", "guest_args"),
    [
        (["/unikernel/kernel.hvt", "7", "x"], ["7", "x"]),  # the entrypoint is dropped
        (["kernel.hvt", "7"], ["7"]),
        (["7", "x"], ["7", "x"]),  # ctr run IMAGE ID 7 x replaces the whole list
        ([], []),
    ],
)
def test_process_args_become_guest_args_without_the_entrypoint(tmp_path, args, guest_args):
    bundle = make_bundle(tmp_path, process={"args": args})
    kernel = read_bundle(str(bundle))
    assert kernel.args == guest_args
    assert kernel.path == str(bundle / "rootfs/unikernel/kernel.hvt")


def test_memory_limit_becomes_mem_in_mib(tmp_path):
    bundle = make_bundle(tmp_path, linux={"resources": {"memory": {"limit": 64 * 2**20 + 12345}}})
    kernel = read_bundle(str(bundle))
    assert kernel.mem_mib == 64
    command, argv = pyvmm_command(), pyvmm_argv(kernel, None, None)
    assert argv[: len(command)] == command
    assert argv[len(command) :] == ["--mem=64", "--", kernel.path]


def test_a_limit_below_2_mib_is_refused(tmp_path):
    bundle = make_bundle(tmp_path, linux={"resources": {"memory": {"limit": 2**20}}})
    with pytest.raises(BundleError, match="below pyvmm's 2 MiB minimum"):
        read_bundle(str(bundle))


def test_annotations_name_the_binary_and_urunc_json_is_read(tmp_path):
    bundle = make_bundle(tmp_path, at="/u/k.hvt")
    notes = {"com.urunc.unikernel.binary": "/u/k.hvt", "com.urunc.unikernel.hypervisor": "hvt"}
    encoded = {k: base64.b64encode(v.encode()).decode() for k, v in notes.items()}
    (bundle / "rootfs" / "urunc.json").write_text(json.dumps(encoded))
    assert read_bundle(str(bundle)).path.endswith("/u/k.hvt")
    notes["com.urunc.unikernel.hypervisor"] = "qemu"
    encoded = {k: base64.b64encode(v.encode()).decode() for k, v in notes.items()}
    (bundle / "rootfs" / "urunc.json").write_text(json.dumps(encoded))
    with pytest.raises(BundleError, match="hvt"):
        read_bundle(str(bundle))


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        ("nothing", "not a unikernel image: no org.pyvmm.unikernel.binary annotation"),
        ("linux binary", "not a unikernel image: /bin/prog: "),  # the loader's reason
        ("missing", "not a unikernel image: /nope (from org.pyvmm.unikernel.binary) is not"),
        ("wrong type", "org.pyvmm.unikernel.type='oci': pyvmm runs Solo5 hvt unikernels only"),
    ],
)
def test_what_is_not_a_unikernel_image_gets_one_line(tmp_path, setup, message):
    config = {"process": {"args": ["/bin/prog"]}}
    bundle = make_bundle(tmp_path, kernel=None, **config)
    if setup == "linux binary":
        (bundle / "rootfs/bin").mkdir()
        shutil.copy(sys.executable, bundle / "rootfs/bin/prog")
    elif setup == "missing":
        (bundle / "rootfs/pyvmm-oci.json").write_text('{"org.pyvmm.unikernel.binary": "/nope"}')
    elif setup == "wrong type":
        (bundle / "rootfs/pyvmm-oci.json").write_text(
            '{"org.pyvmm.unikernel.binary": "/x", "org.pyvmm.unikernel.type": "oci"}'
        )
    with pytest.raises(BundleError) as info:
        read_bundle(str(bundle))
    assert str(info.value).startswith(message), str(info.value)
    assert "\n" not in str(info.value)


def test_namespaces_decide_what_networking_is_possible(tmp_path):
    ns = {"type": "network", "path": "/var/run/netns/pod"}
    kernel = read_bundle(str(make_bundle(tmp_path / "a", "ping", linux={"namespaces": [ns]})))
    assert kernel.netns == "/var/run/netns/pod" and kernel.net_devices == ["service0"]
    kernel = read_bundle(
        str(make_bundle(tmp_path / "b", linux={"namespaces": [{"type": "network"}]}))
    )
    assert kernel.new_netns and kernel.netns is None
    with pytest.raises(BundleError, match="declares net device service0 but"):
        read_bundle(str(make_bundle(tmp_path / "c", "ping")))


def test_the_net_args_template_and_the_net_options(tmp_path):
    link = Link("eth0", "02:00:00:00:00:01", "10.88.0.2", 24, "10.88.0.1", 1500, tap_name("c1"))
    words = net_args("--ipv4={cidr} --ipv4-gateway={gateway} {netmask}", link.values())
    assert words == ["--ipv4=10.88.0.2/24", "--ipv4-gateway=10.88.0.1", "255.255.255.0"]
    with pytest.raises(BundleError, match="bad template"):
        net_args("{nope}", link.values())
    assert len(link.tap) <= 15 and link.tap == tap_name("c1") != tap_name("c2")
    ns = {"type": "network", "path": "/var/run/netns/pod"}
    kernel = read_bundle(str(make_bundle(tmp_path, "ping", linux={"namespaces": [ns]})))
    argv = pyvmm_argv(kernel, link.tap, link.mac)
    assert f"--net:service0={link.tap}" in argv and "--net-mac:service0=02:00:00:00:00:01" in argv


def test_signals_by_number_and_name():
    assert [parse_signal(s) for s in ("15", "SIGKILL", "term", "HUP")] == [15, 9, 15, 1]


def test_the_image_archive_is_an_oci_layout_whose_digests_hold(tmp_path):
    out = tmp_path / "ping.tar"
    ref = oci_image.build(str(guest("ping")), str(out), args=["10.0.0.2"], net_args="{ip}")
    assert ref == "docker.io/pyvmm/ping:latest"
    with tarfile.open(out) as tar:
        files = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}
    assert json.loads(files["oci-layout"]) == {"imageLayoutVersion": "1.0.0"}
    for name, data in files.items():
        if name.startswith("blobs/sha256/"):
            assert name.rsplit("/", 1)[1] == hashlib.sha256(data).hexdigest()
    index = json.loads(files["index.json"])["manifests"][0]
    assert index["annotations"]["io.containerd.image.name"] == ref
    manifest = json.loads(files["blobs/sha256/" + index["digest"][7:]])
    config = json.loads(files["blobs/sha256/" + manifest["config"]["digest"][7:]])
    assert config["config"]["Entrypoint"] == ["/unikernel/ping.hvt"]
    assert config["config"]["Cmd"] == ["10.0.0.2"]
    assert manifest["annotations"]["org.pyvmm.unikernel.net-args"] == "{ip}"
    layer = files["blobs/sha256/" + manifest["layers"][0]["digest"][7:]]
    assert config["rootfs"]["diff_ids"] == [manifest["layers"][0]["digest"]]
    tar_path = tmp_path / "layer.tar"
    tar_path.write_bytes(layer)
    with tarfile.open(tar_path) as tar:
        names = tar.getnames()
        meta = json.loads(tar.extractfile("pyvmm-oci.json").read())
    assert "unikernel/ping.hvt" in names
    assert meta["org.pyvmm.unikernel.binary"] == "/unikernel/ping.hvt"


def test_the_image_tool_refuses_what_is_not_a_unikernel(tmp_path, capsys):
    assert oci_image.main(["-o", str(tmp_path / "x.tar"), sys.executable]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"pyvmm.oci.image: {sys.executable}: ") and err.count("\n") == 1
    assert not (tmp_path / "x.tar").exists()


def test_block_annotations_attach_a_mount_source_or_a_rootfs_file(tmp_path):
    bundle = make_bundle(
        tmp_path,
        annotations={
            "org.pyvmm.unikernel.block.storage": "/data/disk.img",
            "org.pyvmm.unikernel.block.ro": "/images/base.img",
        },
        mounts=[{"destination": "/data/disk.img", "type": "bind", "source": "/srv/disk.img"}],
    )
    kernel = read_bundle(str(bundle))
    argv = pyvmm_argv(kernel, None, None)[len(pyvmm_command()) :]
    assert argv[:2] == [
        f"--block:ro={bundle}/rootfs/images/base.img",
        "--block:storage=/srv/disk.img",
    ]
