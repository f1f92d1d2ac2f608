"""Edges of the OCI bundle parser that the mutation run found untested:
a bundle that names no network namespace, or one by its path, asks for no
new one (only a network entry without a path does); a string quoted in a
message is marked as cut only when it was; a FIFO named as a disk is
refused without being opened for reading; a closed unikernel holds no
descriptor; a value outside base64's alphabet is plain; an empty mount
source is no bind mount of a file; a unikernel of Solo5's ABI version 1
fails create, not start."""

from __future__ import annotations

import json
import shutil

import pytest

from conftest import guest
from pyvmm.oci.bundle import BundleError, read_bundle


def _bundle(tmp_path, namespaces):
    dest = tmp_path / "rootfs" / "unikernel" / "kernel.hvt"
    dest.parent.mkdir(parents=True)
    shutil.copy(guest("hello"), dest)
    spec = {
        "ociVersion": "1.0.2",
        "root": {"path": "rootfs"},
        "process": {"args": []},
        "linux": {"namespaces": namespaces},
    }
    (tmp_path / "config.json").write_text(json.dumps(spec))
    return str(tmp_path)


#: Where the disk bundles' unikernel (blocktest) finds its block device.
DISK = "/data/disk.img"


def _bind(source, **more) -> dict:
    """A bind mount of ``source`` at DISK."""
    return {"destination": DISK, "type": "bind", "source": source, **more}


def _disk_bundle(tmp_path, mounts=(), disk=DISK):
    """blocktest's bundle, its block device "storage" at ``disk``."""
    from test_oci_bundle import make_bundle

    return make_bundle(
        tmp_path / "b",
        "blocktest",
        annotations={"org.pyvmm.unikernel.block.storage": disk},
        mounts=list(mounts),
    )


@pytest.mark.parametrize(
    "namespaces, new",
    [
        ([], False),
        ([{"type": "pid"}, {"type": "mount"}], False),
        ([{"type": "network", "path": "/var/run/netns/pod"}], False),
        ([{"type": "network"}], True),
    ],
)
def test_only_a_network_entry_without_a_path_asks_for_a_new_namespace(tmp_path, namespaces, new):
    with read_bundle(_bundle(tmp_path, namespaces)) as kernel:
        assert kernel.new_netns is new


def test_a_quoted_string_is_cut_with_an_ellipsis_only_past_the_limit():
    """An image's string in a message: escaped when not printable, and
    marked as cut only when something was cut (SHOWN characters fit)."""
    from pyvmm.oci.bundle import SHOWN, shown

    whole = "\n" + "a" * (SHOWN - 1)
    assert shown(whole) == "\\n" + "a" * (SHOWN - 1)
    assert shown(whole + "b") == "\\n" + "a" * (SHOWN - 1) + "..."
    assert shown("a" * SHOWN) == "a" * SHOWN
    assert shown("a" * (SHOWN + 1)) == "a" * SHOWN + "..."


def test_a_fifo_as_a_disk_is_refused_without_waiting_for_a_writer(tmp_path):
    """A block mount's source is opened as a path (O_PATH) and checked
    before it is opened for I/O: opening a FIFO to read would wait for a
    writer that never comes. Bounded by an alarm, so a regression fails."""
    import os
    import signal

    fifo = tmp_path / "disk.fifo"
    os.mkfifo(fifo)
    bundle = _disk_bundle(tmp_path, [_bind(str(fifo))])

    def waited(*_):
        raise TimeoutError("the FIFO was opened for reading")

    old = signal.signal(signal.SIGALRM, waited)
    signal.setitimer(signal.ITIMER_REAL, 5)
    try:
        with pytest.raises(BundleError, match="is not a regular file or block device"):
            with read_bundle(str(bundle)):
                pass
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def test_a_closed_unikernel_holds_no_descriptor(tmp_path):
    """After close nothing is left to pass to pyvmm or to close again (a
    second close must not close whatever took the numbers meanwhile)."""
    kernel = read_bundle(_bundle(tmp_path, []))
    assert kernel.fds() and all(fd > 2 for fd in kernel.fds())
    kernel.close()
    assert kernel.fds() == [] and kernel.fd < 0
    kernel.close()


def test_a_value_with_characters_outside_base64_is_taken_as_written():
    """Annotation values may be base64 or plain: a blank (or anything else
    outside the alphabet) makes a value plain, even when the rest decodes."""
    from pyvmm.oci.bundle import _base64

    assert _base64("dGVzdA==") == "test"
    assert _base64("dGVz dA==") == "dGVz dA=="


def test_a_block_mount_with_an_empty_source_is_no_bind_mount_of_a_file(tmp_path):
    bundle = _disk_bundle(tmp_path, [_bind("")])
    with pytest.raises(BundleError, match="is not a bind mount of a file$"):
        read_bundle(str(bundle))


def test_an_abi_version_1_unikernel_fails_create_not_start(tmp_path):
    """pyvmm-oci starts the VM without --legacy-abi, whose loader refuses
    ABI version 1 (Solo5 0.9 and older): create refuses it first, in one
    line, as it refuses any file that is not a unikernel pyvmm boots."""
    from testkit import helpers

    bundle = _bundle(tmp_path, [])
    kernel = tmp_path / "rootfs" / "unikernel" / "kernel.hvt"
    helpers.with_abi_version(guest("hello"), kernel, 1)
    with pytest.raises(BundleError) as err:
        read_bundle(bundle)
    assert str(err.value) == (
        "not a unikernel image: /unikernel/kernel.hvt: built for Solo5's ABI version 1"
        " (Solo5 0.9 or older), which pyvmm-oci does not run: rebuild it with Solo5 0.10"
        " or later"
    )
    helpers.with_abi_version(guest("hello"), kernel, 2)
    with read_bundle(bundle) as unikernel:
        assert unikernel.fd >= 0


def test_a_message_quotes_200_characters_of_an_images_string():
    """The documented length, not whatever SHOWN says."""
    from pyvmm.oci.bundle import shown

    assert shown("a" * 200) == "a" * 200
    assert shown("a" * 201) == "a" * 200 + "..."


def test_a_relative_mount_source_is_the_bundles_file(tmp_path, monkeypatch):
    """As the OCI runtime spec says of a relative source: relative to the
    bundle, whatever the runtime's working directory."""
    import os

    bundle = _disk_bundle(tmp_path, [_bind("disk.img")])
    (bundle / "disk.img").write_bytes(bytes(4096))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "disk.img").write_bytes(bytes(8192))  # not this one
    monkeypatch.chdir(elsewhere)
    with read_bundle(str(bundle)) as kernel:
        fd = kernel.blocks["storage"].fd
        assert os.fstat(fd).st_ino == os.stat(bundle / "disk.img").st_ino


def test_a_closed_bundle_forgets_its_block_descriptors(tmp_path):
    """Their numbers may be reused once closed: none is kept."""

    host = tmp_path / "disk.img"
    host.write_bytes(bytes(4096))
    bundle = _disk_bundle(tmp_path, [_bind(str(host))])
    with read_bundle(str(bundle)) as kernel:
        blocks = list(kernel.blocks.values())
        assert all(b.fd >= 0 for b in blocks)
    assert kernel.fd == -1 and [b.fd for b in blocks] == [-1]


def test_the_refusal_of_an_image_without_a_unikernel_quotes_its_first_argument(tmp_path):
    import json as _json

    from test_oci_bundle import make_bundle

    bundle = make_bundle(tmp_path / "b", "hello")
    config = _json.loads((bundle / "config.json").read_text())
    config["process"]["args"] = ["/not/here", "/nor/here"]
    config.setdefault("annotations", {}).pop("org.pyvmm.unikernel.binary", None)
    (bundle / "config.json").write_text(_json.dumps(config))
    for extra in ("pyvmm-oci.json", "unikernel/kernel.hvt"):
        (bundle / "rootfs" / extra).unlink(missing_ok=True)
    with pytest.raises(BundleError) as err:
        read_bundle(str(bundle)).close()
    assert "process.args[0] '/not/here' is not a file" in str(err.value)


def test_only_the_first_process_argument_may_name_the_unikernel(tmp_path):
    """process.args[0], then the default path: a later argument that happens
    to be a file in the rootfs is the guest's argument, not its kernel."""
    from test_oci_bundle import make_bundle

    bundle = make_bundle(
        tmp_path / "b", "hello", at="/app/a.hvt", process={"args": ["x", "/app/a.hvt"]}
    )
    with pytest.raises(BundleError, match="process.args\\[0\\] 'x' is not a file"):
        read_bundle(str(bundle)).close()


@pytest.mark.parametrize(
    "mounts",
    [
        ["not a mount"],
        [{"destination": 7}],
        [_bind("/x", options="rw")],
        [_bind("/x", options=["rw", 7])],
    ],
    ids=[
        "not an object",
        "destination not a string",
        "options not a list",
        "an option not a string",
    ],
)
def test_block_mounts_that_are_malformed_are_refused_in_one_line(tmp_path, mounts):
    bundle = _disk_bundle(tmp_path, mounts)
    with pytest.raises(BundleError) as err:
        read_bundle(str(bundle)).close()
    assert "\n" not in str(err.value)
    if isinstance(mounts[0], dict) and "options" in mounts[0]:
        assert "the mount's options are not a list of strings" in str(err.value)


def test_a_block_path_missing_from_the_rootfs_is_named(tmp_path):
    bundle = _disk_bundle(tmp_path, disk="/nope.img")
    with pytest.raises(
        BundleError, match=r"^org\.pyvmm\.unikernel\.block\.storage=/nope\.img: /nope\.img "
    ):
        read_bundle(str(bundle)).close()


def test_a_unikernel_with_net_devices_and_no_namespace_names_its_first(tmp_path):
    from elfbuild import NET, abi_note, devices, good_elf, manifest_desc, manifest_note
    from test_oci_bundle import make_bundle

    bundle = make_bundle(tmp_path / "b", None)
    image = bundle / "rootfs" / "unikernel" / "kernel.hvt"
    image.parent.mkdir(parents=True)
    notes = [abi_note(), manifest_note(manifest_desc(devices((b"first", NET), (b"second", NET))))]
    image.write_bytes(good_elf(notes=notes).build())
    image.chmod(0o755)
    with pytest.raises(BundleError, match="declares net device first but the container"):
        read_bundle(str(bundle)).close()


def test_a_mount_source_that_cannot_be_opened_for_writing_is_named(tmp_path):
    """A read-only sysfs attribute is a regular file that even root cannot
    open read-write: one line naming it and why."""

    source = "/sys/kernel/uevent_seqnum"
    bundle = _disk_bundle(tmp_path, [_bind(source)])
    with pytest.raises(BundleError, match=f"cannot open {source}: Permission denied$"):
        read_bundle(str(bundle)).close()
