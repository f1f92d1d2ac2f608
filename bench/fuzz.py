"""Coverage-guided fuzzing of pyvmm's parsers and hypercall handlers (atheris).

    pip install atheris
    python3 bench/fuzz.py TARGET [--seconds 600] [--corpus DIR] [-- LIBFUZZER_ARGS]

TARGET is one of testkit/fuzztargets.py's: `elf` (the loader: ELF header,
program headers, notes, the ABI, capability and manifest notes), `manifest`,
`cli` (argv, NUL-separated) or `hypercall` (a hypercall number, a GPA and
guest memory contents, answered by pyvmm's handlers against real guest
memory, a block image and a net device), `http` (a request to `pyvmm
serve`'s API socket, cut into pieces) or `oci` (a container's config.json,
an image's /pyvmm-oci.json and /urunc.json and a net-args template, read by
pyvmm-oci against a rootfs with links out of it). The Python code is instrumented
for coverage (atheris.instrument_all), so libFuzzer's feedback covers
pyvmm's Python; the cffi extension is reached through it (its C is not
instrumented: build with clang's -fsanitize=fuzzer-no-link for that).

The corpus (default /tmp/pyvmm-fuzz/TARGET) starts from seeds: the built
guests and elfbuild's good ELF for `elf`, their manifests for `manifest`,
typical command lines for `cli`, well-formed hypercall structs for
`hypercall`. A crash (any exception but the target's own error, or a
crash of the process) is written by libFuzzer as crash-*; copy it to
tests/fuzz_regressions/TARGET-NAME and the suite replays it from then on.

At the end: executions, the corpus size, coverage as libFuzzer counts it
(`cov:` edges and `ft:` features, from its last status line) and crashes.
Without atheris, --hypothesis runs the same target under hypothesis for
--seconds instead (no coverage feedback).
"""

from __future__ import annotations

import argparse
import os
import struct
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "unit"))


def seeds(target: str) -> list[bytes]:
    from elfbuild import good_elf, manifest_desc

    from pyvmm._native import lib

    guests = sorted((ROOT / "guests" / "bin").glob("*.hvt"))
    if target == "elf":
        return [good_elf().build()] + [p.read_bytes() for p in guests[:6]]
    if target == "oci":
        from testkit.fuzztargets import oci_seeds

        return oci_seeds()
    if target == "manifest":
        return [
            manifest_desc([(b"", lib.MFT_RESERVED_FIRST), (b"service0", lib.MFT_DEV_NET_BASIC)]),
            manifest_desc([(b"", lib.MFT_RESERVED_FIRST), (b"storage", lib.MFT_DEV_BLOCK_BASIC)]),
        ]
    if target == "http":
        return [
            b"\x00GET /v1/vms HTTP/1.1\r\nHost: localhost\r\n\r\n",
            b"\x03POST /vms HTTP/1.1\r\nContent-Length: 33\r\n\r\n"
            b'{"argv": ["k.hvt"], "wait": true}',
            b"\x01DELETE /v1/vms/a.b-1 HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}",
            b"\x00POST /pool HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 11\r\n\r\n"
            b'{"size": 2}',
        ]
    if target == "cli":
        return [
            b"--mem=64\0--net:service0=tap0\0--shm=poll\0k.hvt\0arg",
            b"--block:storage=disk.img\0--block-sector-size:storage=4096\0--\0k.hvt",
            b"--stats=1s\0--stats-json=-\0--pin=vcpu=0,io=1\0-vv\0k.hvt",
            b"--query-manifest\0--json\0k.hvt",
        ]
    out = []
    for number in range(16):
        gpa = (0x200000 << 1) | 1
        head = bytes([number]) + struct.pack("<QI", gpa, 0x200000) + bytes([20])
        out.append(head + struct.pack("<QQQQ", 0, 0x300000, 512, 0))
        out.append(head + struct.pack("<QQQQ", 1, 512, 0x300000, 512))
    return out


def run_atheris(target: str, corpus: Path, seconds: int, extra: list[str]) -> int:
    import importlib

    import atheris

    from testkit import fuzztargets

    for module in (
        "pyvmm.command.cli",
        "pyvmm.loader",
        "pyvmm.loader.elf",
        "pyvmm.loader.manifest",
        "pyvmm.loader.notes",
        "pyvmm.hvt.hypercalls",
        "pyvmm.devices.net.hypercalls",
        "pyvmm.devices.block.hypercalls",
        "pyvmm.devices.console",
        "pyvmm.kvm.memory",
        "pyvmm.serve.http",
        "pyvmm.serve.routes",
        "pyvmm.oci.bundle",
        "pyvmm.oci.rootfs",
        "pyvmm.oci.netargs",
        "pyvmm.oci.runtime",
    ):
        importlib.import_module(module)
    atheris.instrument_all()  # every Python function loaded so far: pyvmm's

    function = getattr(fuzztargets, target)

    def one(data: bytes) -> None:
        function(data)

    corpus.mkdir(parents=True, exist_ok=True)
    if not any(corpus.iterdir()):
        for i, seed in enumerate(seeds(target)):
            (corpus / f"seed-{i}").write_bytes(seed)
    argv = [sys.argv[0], str(corpus), f"-max_total_time={seconds}", "-print_final_stats=1"]
    argv += [f"-artifact_prefix={corpus.parent}/{target}-", "-max_len=65536", *extra]
    atheris.Setup(argv, one)
    atheris.Fuzz()
    return 0


def run_hypothesis(target: str, seconds: int) -> int:
    import time

    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from testkit import fuzztargets

    function = getattr(fuzztargets, target)
    pool = seeds(target)
    count = 0
    end = time.monotonic() + seconds

    @settings(max_examples=10**9, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.sampled_from(pool), st.binary(max_size=256), st.integers(0, 4096))
    def one(seed: bytes, noise: bytes, at: int) -> None:
        nonlocal count
        if time.monotonic() > end:
            raise KeyboardInterrupt
        count += 1
        at %= len(seed) + 1
        function(seed[:at] + noise + seed[at + len(noise) :])

    try:
        one()
    except KeyboardInterrupt:
        pass
    print(f"{target}: {count} executions in {seconds} s, no crash")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    from testkit.fuzztargets import TARGETS

    parser.add_argument("target", choices=TARGETS)
    parser.add_argument("--seconds", type=int, default=600)
    parser.add_argument("--corpus", type=Path)
    parser.add_argument("--hypothesis", action="store_true", help="without atheris")
    parser.add_argument("extra", nargs="*", help="libFuzzer arguments (after --)")
    args = parser.parse_args()
    if args.hypothesis:
        return run_hypothesis(args.target, args.seconds)
    corpus = args.corpus or Path("/tmp/pyvmm-fuzz") / args.target
    # libFuzzer exits the process; keep our own stdout tidy.
    os.environ.setdefault("PYTHONHASHSEED", "0")
    return run_atheris(args.target, corpus, args.seconds, args.extra)


if __name__ == "__main__":
    sys.exit(main())
