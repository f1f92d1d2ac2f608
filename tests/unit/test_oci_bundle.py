"""pyvmm-oci's reading of a bundle and the image tool, without containerd
(tests/test_oci.py runs both under the real one)."""

from __future__ import annotations

import base64
import fcntl
import hashlib
import json
import os
import shutil
import stat
import sys
import tarfile

import pytest

from conftest import guest
from pyvmm.oci import image as oci_image
from pyvmm.oci.bundle import BundleError, net_args, read_bundle
from pyvmm.oci.cgroups import PYVMM_OVERHEAD_MIB
from pyvmm.oci.network import Link, tap_name
from pyvmm.oci.runtime import parse_signal, pyvmm_argv, pyvmm_command


def same_file(fd: int, path) -> bool:
    a, b = os.fstat(fd), os.stat(path)
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def make_bundle(tmp_path, kernel="hello", at="/unikernel/kernel.hvt", **config):
    rootfs = tmp_path / "rootfs"
    if kernel:
        dest = rootfs / at.lstrip("/")
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(guest(kernel), dest)
    rootfs.mkdir(parents=True, exist_ok=True)
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
    with read_bundle(str(bundle)) as kernel:
        assert kernel.args == guest_args
        assert same_file(kernel.fd, bundle / "rootfs/unikernel/kernel.hvt")
        assert kernel.path == f"/proc/self/fd/{kernel.fd}"


def test_memory_limit_less_pyvmm_s_overhead_becomes_mem_in_mib(tmp_path):
    bundle = make_bundle(tmp_path, linux={"resources": {"memory": {"limit": 64 * 2**20 + 12345}}})
    kernel = read_bundle(str(bundle))
    assert kernel.mem_mib == 64 - PYVMM_OVERHEAD_MIB
    command, argv = pyvmm_command(), pyvmm_argv(kernel, None, None)
    assert argv[: len(command)] == command
    assert argv[len(command) :] == [f"--mem={64 - PYVMM_OVERHEAD_MIB}", "--", kernel.path]


@pytest.mark.parametrize("mib", [1, PYVMM_OVERHEAD_MIB, PYVMM_OVERHEAD_MIB + 1])
def test_a_limit_too_small_for_pyvmm_and_a_guest_is_refused(tmp_path, mib):
    bundle = make_bundle(tmp_path, linux={"resources": {"memory": {"limit": mib << 20}}})
    with pytest.raises(BundleError, match=r"too small for a VM: pyvmm needs 16 MiB besides"):
        read_bundle(str(bundle))


def test_annotations_name_the_binary_and_urunc_json_is_read(tmp_path):
    bundle = make_bundle(tmp_path, at="/u/k.hvt")
    notes = {"com.urunc.unikernel.binary": "/u/k.hvt", "com.urunc.unikernel.hypervisor": "hvt"}
    encoded = {k: base64.b64encode(v.encode()).decode() for k, v in notes.items()}
    (bundle / "rootfs" / "urunc.json").write_text(json.dumps(encoded))
    with read_bundle(str(bundle)) as kernel:
        assert same_file(kernel.fd, bundle / "rootfs/u/k.hvt")
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
    assert err.startswith(f"pyvmm-oci pack: {sys.executable}: ") and err.count("\n") == 1
    assert not (tmp_path / "x.tar").exists()


def test_block_annotations_attach_a_mount_source_or_a_rootfs_file_as_descriptors(tmp_path):
    host = tmp_path / "srv" / "disk.img"
    host.parent.mkdir()
    host.write_bytes(bytes(4096))
    bundle = make_bundle(
        tmp_path / "b",
        "blocktest",
        annotations={"org.pyvmm.unikernel.block.storage": "/data/disk.img"},
        mounts=[{"destination": "/data/disk.img", "type": "bind", "source": str(host)}],
    )
    with read_bundle(str(bundle)) as kernel:
        block = kernel.blocks["storage"]
        assert same_file(block.fd, host)
        argv = pyvmm_argv(kernel, None, None)[len(pyvmm_command()) :]
        assert argv == [f"--block:storage=@{block.fd}", "--", f"/proc/self/fd/{kernel.fd}"]
    (bundle / "rootfs" / "images").mkdir()
    (bundle / "rootfs" / "images" / "base.img").write_bytes(bytes(4096))
    config = json.loads((bundle / "config.json").read_text())
    config["annotations"]["org.pyvmm.unikernel.block.storage"] = "/images/base.img"
    (bundle / "config.json").write_text(json.dumps(config))
    with read_bundle(str(bundle)) as kernel:
        assert same_file(kernel.blocks["storage"].fd, bundle / "rootfs/images/base.img")
        assert fcntl.fcntl(kernel.blocks["storage"].fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDWR


# -- what an image may ask for ----------------------------------------------------

BLOCK = "org.pyvmm.unikernel.block.storage"


def image_notes(bundle, notes: dict) -> None:
    (bundle / "rootfs" / "pyvmm-oci.json").write_text(json.dumps(notes))


def test_a_block_link_out_of_the_rootfs_reaches_no_host_file(tmp_path):
    """The image's /disk.img is a link to a root-only host file: resolved in
    the rootfs, it names nothing, and the host file is not opened."""
    host = tmp_path / "secret.img"
    host.write_bytes(b"s" * 4096)
    host.chmod(0o600)
    bundle = make_bundle(tmp_path / "b", "blocktest")
    os.symlink(host, bundle / "rootfs" / "disk.img")
    image_notes(bundle, {BLOCK: "/disk.img"})
    with pytest.raises(BundleError) as info:
        read_bundle(str(bundle))
    assert str(info.value) == f"{BLOCK}=/disk.img: /disk.img is not a file in the rootfs"
    assert host.read_bytes() == b"s" * 4096


def test_a_block_device_node_in_an_image_is_refused(tmp_path):
    """Which host disk a guest gets is the operator's choice (a bind mount),
    never the image's: a device node it carries is refused unopened."""
    if os.geteuid() != 0:
        pytest.skip("mknod needs root")
    bundle = make_bundle(tmp_path, "blocktest")
    os.mknod(bundle / "rootfs" / "sda", stat.S_IFBLK | 0o600, os.makedev(7, 0))
    image_notes(bundle, {BLOCK: "/sda"})
    with pytest.raises(BundleError, match=r"/sda is a device node \(an image may name regular"):
        read_bundle(str(bundle))


def test_a_bind_mount_the_operator_made_may_be_a_host_block_device(tmp_path, loop_device):
    bundle = make_bundle(
        tmp_path,
        "blocktest",
        annotations={BLOCK: "/dev/disk"},
        mounts=[{"destination": "/dev/disk", "type": "bind", "source": loop_device[0]}],
    )
    with read_bundle(str(bundle)) as kernel:
        assert stat.S_ISBLK(os.fstat(kernel.blocks["storage"].fd).st_mode)


@pytest.mark.parametrize(
    ("mount", "message"),
    [
        ({"type": "bind", "options": ["rbind", "ro"]}, r"is read-only \(pyvmm attaches"),
        ({"type": "tmpfs", "source": "tmpfs"}, "is not a bind mount of a file"),
        ({"type": "bind", "source": "/nonexistent/x"}, "cannot open the mount's source"),
        ({"type": "bind", "source": "/"}, "is not a regular file or block device"),
    ],
)
def test_mounts_that_cannot_back_a_disk_are_refused(tmp_path, mount, message):
    host = tmp_path / "disk.img"
    host.write_bytes(bytes(4096))
    mount = {"destination": "/data", "source": str(host), **mount}
    bundle = make_bundle(tmp_path / "b", "blocktest", annotations={BLOCK: "/data"}, mounts=[mount])
    with pytest.raises(BundleError, match=message):
        read_bundle(str(bundle))


def test_a_block_annotation_must_name_a_device_the_unikernel_declares(tmp_path):
    """The name goes on pyvmm's command line: only a declared one does."""
    bundle = make_bundle(tmp_path, "blocktest")
    (bundle / "rootfs" / "disk.img").write_bytes(bytes(4096))
    image_notes(bundle, {"org.pyvmm.unikernel.block.storage=/etc/passwd": "/disk.img"})
    with pytest.raises(BundleError, match=r"declares no block device .* \(its block devices: stor"):
        read_bundle(str(bundle))


def test_a_kernel_link_says_nothing_about_the_host(tmp_path):
    """A link to a host file that exists and one to a file that does not give
    the same line."""
    messages = set()
    for target in ("/etc/passwd", "/etc/no-such-file"):
        bundle = make_bundle(tmp_path / target.rsplit("/", 1)[1], kernel=None)
        os.symlink(target, bundle / "rootfs" / "k.hvt")
        image_notes(bundle, {"org.pyvmm.unikernel.binary": "/k.hvt"})
        with pytest.raises(BundleError) as info:
            read_bundle(str(bundle))
        messages.add(str(info.value))
    assert messages == {
        "not a unikernel image: /k.hvt (from org.pyvmm.unikernel.binary) "
        "is not a file in the rootfs"
    }


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("[" * 30000 + "]" * 30000, "/pyvmm-oci.json in the image is nested too deeply"),
        ('{"a": ' * 5 + "1" + "}" * 5, "the value of a is not a string"),
        ("[1]", "/pyvmm-oci.json in the image is not a JSON object"),
        ("{" * 3, "/pyvmm-oci.json in the image is not valid JSON"),
        (" " * 70000, "/pyvmm-oci.json in the image is larger than 65536 bytes"),
        (b"\xff\xfe", "/pyvmm-oci.json in the image is not valid JSON"),
    ],
    ids=["deep", "not a string", "not an object", "cut short", "too large", "not utf-8"],
)
def test_bad_metadata_in_an_image_gets_one_line(tmp_path, content, message):
    bundle = make_bundle(tmp_path)
    path = bundle / "rootfs" / "pyvmm-oci.json"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(BundleError) as info:
        read_bundle(str(bundle))
    assert str(info.value).startswith(message) or message in str(info.value), str(info.value)
    assert "\n" not in str(info.value) and len(str(info.value)) < 400


def test_a_fifo_or_a_link_as_metadata_is_not_read(tmp_path):
    """A FIFO would block create; a link to a host file would be parsed."""
    bundle = make_bundle(tmp_path)
    os.mkfifo(bundle / "rootfs" / "pyvmm-oci.json")
    with pytest.raises(BundleError, match="^/pyvmm-oci.json in the image is not a regular file$"):
        read_bundle(str(bundle))
    os.unlink(bundle / "rootfs" / "pyvmm-oci.json")
    host = tmp_path / "notes.json"
    host.write_text('{"org.pyvmm.unikernel.binary": "/nope"}')
    os.symlink(host, bundle / "rootfs" / "pyvmm-oci.json")
    with read_bundle(str(bundle)) as kernel:  # the default path: the host's notes unread
        assert kernel.inner == "/unikernel/kernel.hvt"


def test_read_bundle_leaves_no_descriptor_open_when_it_refuses(tmp_path):
    bundle = make_bundle(tmp_path, "blocktest")
    image_notes(bundle, {BLOCK: "/missing.img"})
    before = sorted(os.listdir("/proc/self/fd"))
    for _ in range(3):
        with pytest.raises(BundleError):
            read_bundle(str(bundle))
    assert sorted(os.listdir("/proc/self/fd")) == before


# -- the network arguments template ------------------------------------------------


LINK = Link("eth0", "02:00:00:00:00:01", "10.88.0.2", 24, "10.88.0.1", 1500, "pvtap0")


@pytest.mark.parametrize(
    "template",
    ["{ip.x}", "{ip[0]}", "{ip:>99999999}", "{ip!r}", "{}", "{0}", "{ip", "ip}", "{tap}"],
)
def test_the_template_takes_plain_names_only(template):
    with pytest.raises(BundleError) as info:
        net_args(template, LINK.values())
    line = str(info.value)
    assert line.startswith("org.pyvmm.unikernel.net-args: bad template: ")
    assert "\n" not in line and len(line) < 300


def test_the_template_and_its_words_are_capped():
    """15 characters may not become a megabyte for shlex to split."""
    with pytest.raises(BundleError, match="2000 characters, more than 1024"):
        net_args("x" * 2000, LINK.values())
    with pytest.raises(BundleError, match="expands to 3059 characters, more than 2048"):
        net_args("{mac}" * 170 + "x" * 169, LINK.values())
    assert net_args("{{{ip}}} '{cidr} x'", LINK.values()) == ["{10.88.0.2}", "10.88.0.2/24 x"]


def test_a_bad_template_in_an_image_is_refused_before_any_network_set_up(tmp_path):
    ns = {"type": "network", "path": "/var/run/netns/pod"}
    bundle = make_bundle(tmp_path, "ping", linux={"namespaces": [ns]})
    image_notes(bundle, {"org.pyvmm.unikernel.net-args": "{ip.__class__}"})
    with pytest.raises(BundleError, match="bad template: '{ip.__class__}' is not a name"):
        read_bundle(str(bundle))


def test_the_image_tool_refuses_a_bad_template(tmp_path, capsys):
    out = tmp_path / "x.tar"
    assert oci_image.main(["-o", str(out), "--net-args", "{ip:>9}", str(guest("ping"))]) == 1
    assert capsys.readouterr().err.startswith("pyvmm-oci pack: --net-args: '{ip:>9}' is not")
    assert not out.exists()


@pytest.mark.parametrize(
    "where",
    ["process.args", "a block path", "a mount's source", "the netns path", "root.path"],
)
def test_a_nul_character_is_refused_wherever_it_would_reach_a_path_or_argv(tmp_path, where):
    """execve and open stop at a NUL (or Python refuses it there, late):
    a string carrying one is refused when the bundle is read."""
    config: dict = {}
    if where == "process.args":
        config["process"] = {"args": ["7\0x"]}
    elif where == "a block path":
        config["annotations"] = {BLOCK: "/disk.img\0x"}
    elif where == "a mount's source":
        config["annotations"] = {BLOCK: "/data"}
        config["mounts"] = [{"destination": "/data", "type": "bind", "source": "/tmp\0x"}]
    elif where == "the netns path":
        config["linux"] = {"namespaces": [{"type": "network", "path": "/run/netns/a\0b"}]}
    else:
        config["root"] = {"path": "rootfs\0x"}
    bundle = make_bundle(tmp_path, "blocktest", **config)
    (bundle / "rootfs" / "disk.img").write_bytes(bytes(4096))
    with pytest.raises(BundleError) as info:
        read_bundle(str(bundle))
    assert "NUL" in str(info.value) or "is not a file in the rootfs" in str(info.value)
    assert "\n" not in str(info.value) and "\0" not in str(info.value)
