"""Fuzzing in CI, bounded (a few seconds each): every parser of untrusted
input driven by hypothesis through testkit/fuzztargets.py, the same targets
bench/fuzz.py runs under atheris for hours. A target may only end cleanly or
with its layer's own error (LoaderError, PyvmmError, GuestFault, Halt).

Also replayed: every input in tests/fuzz_regressions/ (what a long run
found, named TARGET-*), so a fixed crash stays fixed.
"""

from __future__ import annotations

import struct
from collections import Counter
from pathlib import Path

import pytest
from elfbuild import (
    BASE,
    PF_R,
    PF_W,
    PF_X,
    Elf,
    NoteSpec,
    Seg,
    abi_note,
    devices,
    good_elf,
    manifest_desc,
    manifest_note,
)
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from pyvmm._native import lib
from testkit import fuzztargets

REGRESSIONS = Path(__file__).resolve().parent.parent / "fuzz_regressions"
SETTINGS = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    # The same examples on every run (the seed from the test itself): the
    # floors below are about what the strategies reach, and a random seed made
    # them a coin toss (9 accepted manifests of 150 against a floor of 10 once).
    # Open-ended search is bench/fuzz.py's job.
    derandomize=True,
    database=None,
)
GOOD = good_elf().build()

u64 = st.one_of(
    st.sampled_from([0, 1, 0xFFF, 0x1000, BASE, 1 << 32, (1 << 63), (1 << 64) - 1]),
    st.integers(0, (1 << 64) - 1),
)
u32 = st.one_of(st.sampled_from([0, 1, 4, 8, 0xFFFF, 0xFFFFFFFF]), st.integers(0, 0xFFFFFFFF))


def check(outcomes: Counter, **floors: int) -> None:
    for outcome, floor in floors.items():
        assert outcomes[outcome] >= floor, outcomes


# -- ELF: header bytes, program headers, notes -----------------------------------------


@st.composite
def mutated_elves(draw) -> bytes:
    """The good file with a few bytes changed, mostly in the headers."""
    data = bytearray(GOOD)
    for _ in range(draw(st.sampled_from([0, 1, 2, 6]))):
        limit = draw(st.sampled_from([64, 64 + 56 * 6, len(data)]))
        at = draw(st.integers(0, limit - 1))
        data[at] = draw(st.integers(0, 255))
    if draw(st.booleans()):
        data = data[: draw(st.integers(0, len(data)))]
    return bytes(data)


@st.composite
def built_elves(draw) -> bytes:
    """Structured: random segments, notes and header knobs."""
    segs = [
        Seg(
            draw(st.one_of(st.just(BASE + 0x1000 * i), u64)),
            draw(st.binary(max_size=64)),
            draw(st.sampled_from([PF_R, PF_R | PF_W, PF_R | PF_X, 0, 0xFFFFFFFF])),
            memsz=draw(st.none() | u64),
            filesz=draw(st.none() | u64),
            offset=draw(st.none() | u64),
        )
        for i in range(draw(st.integers(0, 5)))
    ]
    notes = [abi_note()] if draw(st.booleans()) else []
    notes += [
        NoteSpec(
            draw(st.sampled_from([b"Solo5", b"pyvmm", b"", b"x" * 40])),
            draw(st.sampled_from([lib.SOLO5_NOTE_ABI, lib.SOLO5_NOTE_MANIFEST, 0]) | u32),
            draw(st.binary(max_size=300)),
            desc_align=draw(st.sampled_from([4, 8])),
            descsz=draw(st.none() | u32),
        )
        for _ in range(draw(st.integers(0, 3)))
    ]
    if draw(st.booleans()):
        notes.append(manifest_note(manifest_desc(devices((b"service", lib.MFT_DEV_NET_BASIC)))))
    elf = Elf(segments=segs, notes=notes, entry=draw(st.just(BASE) | u64))
    elf.notes_in_one_segment = draw(st.booleans())
    if draw(st.booleans()):
        elf.phnum = draw(st.integers(0, 0xFFFF))
    return elf.build()


def test_elf_headers_and_program_headers_raise_only_loader_errors() -> None:
    outcomes: Counter = Counter()

    @SETTINGS
    @given(st.one_of(mutated_elves(), built_elves()))
    def run(data: bytes) -> None:
        outcome = fuzztargets.elf(data)
        event(outcome)
        outcomes[outcome] += 1

    run()
    check(outcomes, accepted=1, refused=50)


# -- the manifest ----------------------------------------------------------------------

names = st.one_of(st.binary(max_size=80), st.sampled_from([b"", b"service0", b"a" * 67, b"\xff"]))


@st.composite
def manifests(draw) -> bytes:
    kind = draw(st.integers(0, 3))
    if kind == 0:
        return draw(st.binary(max_size=2048))
    types = st.sampled_from([lib.MFT_DEV_NET_BASIC, lib.MFT_DEV_BLOCK_BASIC])
    if kind == 1:  # well-formed: the reserved entry, unique names, known types
        n = draw(st.integers(0, 8))
        entries = [(b"", lib.MFT_RESERVED_FIRST)] + [(b"dev%d" % i, draw(types)) for i in range(n)]
        return manifest_desc(entries)
    entries = draw(st.lists(st.tuples(names, types | u32), max_size=draw(st.sampled_from([4, 70]))))
    first = [(b"", lib.MFT_RESERVED_FIRST)] if draw(st.booleans()) else []
    desc = manifest_desc(
        first + entries,
        version=draw(st.sampled_from([1, 2, 0]) | u32),
        count=draw(st.none() | u32),
        attached=draw(st.lists(st.integers(0, 70), max_size=3)),
    )
    if draw(st.booleans()):
        desc = desc[: draw(st.integers(0, len(desc)))]
    return desc


def test_manifests_raise_only_loader_errors() -> None:
    outcomes: Counter = Counter()

    @SETTINGS
    @given(manifests())
    def run(data: bytes) -> None:
        outcome = fuzztargets.manifest(data)
        event(outcome)
        outcomes[outcome] += 1

    run()
    check(outcomes, accepted=10, refused=20)


# -- the command line ------------------------------------------------------------------

OPTIONS = [
    "--mem", "--net", "--net:service0", "--net-mac:service0", "--block:storage",
    "--block-sector-size:storage", "--no-lock", "--cpl", "--shm", "--hybrid-budget",
    "--no-net-ring", "--legacy-abi", "--shm-slots", "--pin", "--stats", "--stats-json",
    "-v", "-vv", "--log-level", "-q", "--quiet", "--query-manifest", "--json", "-h",
    "--help", "--version", "--host-info", "--no-sandbox", "--user", "--", "-", "k.hvt",
]  # fmt: skip
VALUES = st.one_of(
    st.sampled_from(["", "0", "1", "64", "-1", "4096", "poll", "vcpu=0,io=1", "1s",
                     "02:00:00:00:00:02", "tap0", "@3", "x=y", "=", "99999999999999999999",
                     "\x00", "\udcff"]),
    st.text(max_size=12),
)  # fmt: skip


@st.composite
def argvs(draw) -> bytes:
    argv = []
    for _ in range(draw(st.integers(0, 8))):
        opt = draw(st.sampled_from(OPTIONS) | st.text(max_size=10))
        how = draw(st.integers(0, 2))
        if how == 0:
            argv.append(opt)
        elif how == 1:
            argv.append(f"{opt}={draw(VALUES)}")
        else:
            argv += [opt, draw(VALUES)]
    return b"\0".join(a.encode("utf-8", "surrogateescape") for a in argv)


def test_the_command_line_raises_only_pyvmm_errors() -> None:
    outcomes: Counter = Counter()

    @SETTINGS
    @given(argvs())
    def run(data: bytes) -> None:
        outcome = fuzztargets.cli(data)
        event(outcome)
        outcomes[outcome] += 1

    run()
    check(outcomes, accepted=5, refused=15)


# -- the hypercall handlers ------------------------------------------------------------


FIELDS = st.one_of(
    st.sampled_from([0, 1, 2, 64, 512, 1514, 4096, 0x100000, 0x200000, 0x300000, 0x3FFFF0]),
    u64,
).map(lambda v: struct.pack("<Q", v))


@st.composite
def hypercall_inputs(draw) -> bytes:
    """Often a struct that makes sense in part: plausible handles, lengths,
    pointers and offsets mixed with random ones."""
    number = draw(st.integers(0, 255))
    at = draw(st.sampled_from([0x200000, 0x0FFFF8, 0x3FFFF8]) | st.integers(0, 0xFFFFFFFF))
    gpa = draw(st.just(at % fuzztargets.MEM_SIZE << 1 | 1) | u64)
    frame = draw(st.integers(0, 255))
    body = b"".join(draw(st.lists(FIELDS, max_size=6))) + draw(st.binary(max_size=32))
    return bytes([number]) + struct.pack("<QI", gpa, at) + bytes([frame]) + body


def test_hypercall_handlers_on_random_arguments_and_memory_give_guest_faults_or_answers() -> None:
    outcomes: Counter = Counter()

    @SETTINGS
    @given(hypercall_inputs())
    def run(data: bytes) -> None:
        outcome = fuzztargets.hypercall(data)
        event(outcome)
        outcomes[outcome] += 1

    run()
    check(outcomes, answered=3, **{"guest fault": 10})


# -- what long runs found --------------------------------------------------------------


@pytest.mark.parametrize("path", sorted(REGRESSIONS.glob("*-*")), ids=lambda p: p.name)
def test_fuzz_regression(path: Path) -> None:
    target = path.name.split("-", 1)[0]
    assert target in fuzztargets.TARGETS
    fuzztargets.run(target, path.read_bytes())
