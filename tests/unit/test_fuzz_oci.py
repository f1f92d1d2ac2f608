"""Fuzzing in CI, bounded: a container's config.json and an image's
/pyvmm-oci.json, /urunc.json and net-args template, through
testkit.fuzztargets.oci (bench/fuzz.py runs the same target under atheris).
Only BundleError may refuse them, in one line; what is accepted holds only
files of the rootfs (or an operator's bind mount), never the host's.

What a long run found is replayed by tests/unit/test_fuzz.py from
tests/fuzz_regressions/oci-*."""

from __future__ import annotations

import base64
import json
from collections import Counter

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from testkit import fuzztargets

SETTINGS = settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    # The same examples on every run (the seed from the test itself): the
    # floors below are about what the strategies reach, and a random seed made
    # them a coin toss (9 accepted manifests of 150 against a floor of 10 once).
    # Open-ended search is bench/fuzz.py's job.
    derandomize=True,
    database=None,
)
BLOCK = "org.pyvmm.unikernel.block."
PATHS = st.sampled_from(
    [
        "/unikernel/kernel.hvt",
        "/unikernel/blocktest.hvt",
        "unikernel/ping.hvt",
        "/dir/blocktest.hvt",
        "/disk.img",
        "/escape",
        "/up",
        "/loop",
        "/proc",
        "/fifo",
        "/null",
        "/dir",
        "/",
        "/../../disk.img",
        "/data",
        "/nope",
        "",
    ]
) | st.text(max_size=30)
NAMES = st.sampled_from(["storage", "service0", "storage=x", "", "a" * 80]) | st.text(max_size=8)
TEMPLATES = st.sampled_from(
    ["{ip}", "--ipv4={cidr} --ipv4-gateway={gateway}", "{ip.x}", "{ip:>99999}", "{{ip}}", "'{mac"]
) | st.text(alphabet="{}ipcdrmacx'\" \\:.!0[]", max_size=40)
JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=10),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)


@st.composite
def annotations(draw) -> dict:
    notes: dict = {}
    if draw(st.booleans()):
        notes["org.pyvmm.unikernel.binary"] = draw(PATHS)
    if draw(st.booleans()):
        notes["org.pyvmm.unikernel.type"] = draw(st.sampled_from(["hvt", "solo5", "qemu", ""]))
    if draw(st.booleans()):
        notes["org.pyvmm.unikernel.net-args"] = draw(TEMPLATES)
    for _ in range(draw(st.integers(0, 2))):
        notes[BLOCK + draw(NAMES)] = draw(PATHS)
    if draw(st.integers(0, 9)) == 0:
        notes[draw(st.text(max_size=8))] = draw(JSONISH)  # not a string: refused
    return notes


@st.composite
def configs(draw) -> dict:
    spec: dict = {"ociVersion": "1.0.2"}
    if draw(st.booleans()):
        spec["root"] = {"path": "rootfs"}
    spec["process"] = {"args": draw(st.lists(PATHS | st.integers(), max_size=3))}
    if draw(st.booleans()):
        spec["annotations"] = draw(annotations())
    if draw(st.booleans()):
        limit = draw(st.sampled_from([0, 1, 2 << 20, 64 << 20, -5, 2**70, True, "64"]))
        spec["linux"] = {"resources": {"memory": {"limit": limit}}}
    if draw(st.booleans()):
        ns = {"type": "network"}
        if draw(st.booleans()):
            ns["path"] = draw(st.sampled_from(["/var/run/netns/pod", "", 7]))
        spec.setdefault("linux", {})["namespaces"] = [ns]
    if draw(st.booleans()):
        spec["mounts"] = [
            {
                "destination": draw(PATHS),
                "type": draw(st.sampled_from(["bind", "tmpfs", "proc"])),
                "source": draw(st.sampled_from(["/srv/disk.img", "tmpfs", "/proc"])),
                "options": draw(st.lists(st.sampled_from(["rbind", "ro", "rw", "nosuid"]))),
            }
            for _ in range(draw(st.integers(1, 2)))
        ]
    if draw(st.integers(0, 9)) == 0:  # a wrong type where an object belongs
        spec[draw(st.sampled_from(["root", "process", "linux", "mounts", "annotations"]))] = draw(
            JSONISH
        )
    return spec


@st.composite
def bundles(draw) -> bytes:
    config = json.dumps(draw(configs())).encode()
    meta = json.dumps(draw(annotations())).encode() if draw(st.booleans()) else b""
    urunc = b""
    if draw(st.integers(0, 3)) == 0:
        value = base64.b64encode(draw(PATHS).encode("utf-8", "surrogatepass")).decode()
        urunc = json.dumps({"com.urunc.unikernel.binary": value}).encode()
    parts = [config, meta, urunc]
    if draw(st.booleans()):
        parts.append(draw(TEMPLATES).encode("utf-8", "surrogatepass"))
    return b"\0".join(parts)


@st.composite
def mutated_seeds(draw) -> bytes:
    seed = bytearray(draw(st.sampled_from(fuzztargets.oci_seeds())))
    for _ in range(draw(st.integers(1, 6))):
        at = draw(st.integers(0, len(seed)))
        seed[at:at] = draw(st.binary(min_size=0, max_size=4))
        if seed and draw(st.booleans()):
            del seed[draw(st.integers(0, len(seed) - 1))]
    return bytes(seed)


def test_bundles_and_annotations_raise_only_bundle_errors_and_stay_in_the_rootfs() -> None:
    outcomes: Counter = Counter()

    @SETTINGS
    @given(st.one_of(bundles(), mutated_seeds()))
    def run(data: bytes) -> None:
        outcome = fuzztargets.oci(data)
        event(outcome)
        outcomes[outcome] += 1

    run()
    assert outcomes["accepted"] >= 10 and outcomes["refused"] >= 50, outcomes


def test_the_seeds_are_accepted_but_the_one_whose_disk_leaves_the_rootfs() -> None:
    """The target's own seeds (bench/fuzz.py starts from them) do what they
    say: all accepted but the block annotation naming a link to the host."""
    outcomes = [fuzztargets.oci(seed) for seed in fuzztargets.oci_seeds()]
    assert outcomes.count("refused") == 1 and outcomes[3] == "refused", outcomes
