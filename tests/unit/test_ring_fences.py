"""The sleep handshake's full barriers, as compiled (csrc/shmstream_ring.h).

A consumer announces sleep and then reads the producer's index; a producer
publishes and then reads the consumer's flag. Each side's store must be
visible before its load, which acquire/release alone does not give (x86
may satisfy the load before the store leaves its store buffer): without a
full barrier both sides can miss each other and a frame waits for the next
one. No test of the protocol's states can see that reordering; this one
reads the machine code of the header's two functions, built into the test
kit from the same header the IO thread and the guests use, for the
barrier instruction.
"""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from testkit import build, native  # noqa: F401 - native builds the kit if stale

# What gcc emits for __atomic_thread_fence(__ATOMIC_SEQ_CST).
FULL_BARRIER = {
    "x86_64": re.compile(r"\t(mfence|lock )"),
    "aarch64": re.compile(r"\tdmb\s+ish\b"),
}


def machine_code(function: str) -> str:
    library = build.built()
    assert library is not None
    out = subprocess.run(
        ["objdump", "-d", f"--disassemble={function}", library],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    body = out[out.index(f"<{function}>:") :]
    assert "ret" in body, body
    return body


@pytest.mark.parametrize("function", ["shm_test_cons_prepare_sleep", "shm_test_prod_needs_notify"])
def test_each_side_of_the_sleep_handshake_has_a_full_barrier(function):
    barrier = FULL_BARRIER[os.uname().machine]
    assert barrier.search(machine_code(function)), machine_code(function)


def test_the_plain_ring_steps_have_none():
    """The check itself tells the two apart: publishing is a release store."""
    barrier = FULL_BARRIER[os.uname().machine]
    assert not barrier.search(machine_code("shm_test_prod_publish"))
