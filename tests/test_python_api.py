"""The Python API (pyvmm.api.Guest) as a program meets it: its errors name
its keyword arguments, a ``with`` block cleans up whatever happens in it,
and the console can be taken into a buffer, a file or a function."""

from __future__ import annotations

import io
import os
import threading
import time

import pytest

from conftest import guest
from pyvmm.api import Guest, api_words
from pyvmm.common.errors import LoaderError, OutputError, PyvmmError, UsageError
from pyvmm.devices.console import ConsoleClosed


def _running_guests() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "pyvmm-vcpu"]


# -- errors in the API's words -----------------------------------------------------


def test_an_unknown_keyword_is_named_with_the_close_one():
    with pytest.raises(UsageError) as err:
        Guest(guest("hello"), memory=64)
    assert str(err.value) == "Guest(): unknown option memory=64 (did you mean mem=?)"


@pytest.mark.parametrize(
    "options, message",
    [
        ({"mem": "x"}, "Malformed argument to mem: 'x' is not a positive integer"),
        ({"shm": "fast"}, "shm: 'fast' is not one of off, poll, event, hybrid"),
        ({"hybrid_budget": 5}, "hybrid_budget applies only to shm='hybrid'"),
        ({"stats": "often"}, "stats: 'often' is not an interval such as 1s or 500ms"),
        ({"no_net_ring": "yes"}, "no_net_ring takes no value (given: no_net_ring='yes')"),
    ],
)
def test_a_bad_value_is_named_as_its_keyword(options, message):
    with pytest.raises(UsageError) as err:
        Guest(guest("hello"), **options)
    assert str(err.value) == message


@pytest.mark.kvm
def test_errors_of_the_plan_name_keywords_too():
    """What only start() finds (the memory limit, the manifest's devices)."""
    with pytest.raises(UsageError) as err:
        Guest(guest("edges"), mem=4097).start()
    assert str(err.value).startswith("mem=4097: guest memory size 4296015872 bytes exceeds")
    with pytest.raises(PyvmmError) as err:
        Guest(guest("ping"), net={"eth0": "tap100"}).start()
    assert "--" not in str(err.value) and "'eth0'" in str(err.value), err.value


@pytest.mark.parametrize("key", ["verbose", "quiet", "log_level", "trace", "json", "help"])
def test_the_commands_own_options_are_refused_with_what_to_do(key):
    with pytest.raises(UsageError, match=rf"^Guest\(\): {key}= is the pyvmm command's: "):
        Guest(guest("hello"), **{key: True})


def test_api_words_rewrites_each_spelling_of_an_option():
    assert api_words("--mem=4097: too big") == "mem=4097: too big"
    assert api_words("use --net:NAME=IFACE") == "use net={'NAME': 'IFACE'}"
    assert api_words("(--shm=off for plain hypercalls)") == "(shm='off' for plain hypercalls)"
    assert api_words("--no-net-ring: hypercalls") == "no_net_ring: hypercalls"
    # Not an option of pyvmm's: left alone.
    assert api_words("the guest's --frob=1") == "the guest's --frob=1"


# -- the context manager --------------------------------------------------------------


@pytest.mark.kvm
def test_a_with_block_stops_a_running_guest_at_its_end():
    with Guest(guest("spin"), console=io.BytesIO()) as vm:
        deadline = time.monotonic() + 30
        while vm.counters()["seconds"] < 0.1:
            assert time.monotonic() < deadline
            time.sleep(0.02)
    assert vm.wait(timeout=0) == 143
    assert "SIGTERM" in str(vm.error)
    assert _running_guests() == []


@pytest.mark.kvm
def test_a_with_block_cleans_up_when_its_body_raises():
    with pytest.raises(KeyError), Guest(guest("spin"), console=io.BytesIO()) as vm:
        raise KeyError("the caller's own error")
    assert vm.wait(timeout=0) == 143 and _running_guests() == []
    # Nothing of it is left: the next guest may start.
    with Guest(guest("hello"), console=io.BytesIO()) as ok:
        assert ok.wait(timeout=60) == 0


@pytest.mark.kvm
def test_a_with_block_whose_start_fails_raises_and_leaves_nothing(tmp_path):
    with pytest.raises(LoaderError, match="Could not open"):
        with Guest(str(tmp_path / "missing.hvt")):
            pytest.fail("the body must not run")
    assert _running_guests() == []


# -- the console ----------------------------------------------------------------------


@pytest.mark.kvm
def test_the_console_into_a_buffer():
    out = io.BytesIO()
    with Guest(guest("hello"), console=out) as vm:
        assert vm.wait(timeout=60) == 0
    text = out.getvalue()
    assert b"Hello, world\n" in text and text.endswith(b"SUCCESS\n"), text


@pytest.mark.kvm
def test_the_console_into_a_function_and_into_a_file(tmp_path):
    pieces: list[bytes] = []
    with Guest(guest("args"), "one", "two", console=pieces.append) as vm:
        assert vm.wait(timeout=60) == 0
    assert all(isinstance(p, bytes) for p in pieces) and b"one two" in b"".join(pieces)
    path = tmp_path / "console.txt"
    with path.open("wb") as f, Guest(guest("hello"), console=f) as vm:
        assert vm.wait(timeout=60) == 0
    assert b"Hello, world\n" in path.read_bytes()


@pytest.mark.kvm
def test_a_console_function_that_raises_ends_the_run_with_one_line():
    def broken(data: bytes) -> None:
        raise ValueError("disk full")

    with Guest(guest("hello"), console=broken) as vm:
        assert vm.wait(timeout=60) == 1
    assert isinstance(vm.error, OutputError)
    assert str(vm.error) == "console: ValueError: disk full (the guest was stopped)"


@pytest.mark.kvm
def test_a_console_pipe_whose_reader_left_ends_the_run_with_141():
    """As the command's stdout does (SIGPIPE's status, after the clean-up)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    with open(write_end, "wb", buffering=0) as pipe, Guest(guest("chatty"), console=pipe) as vm:
        assert vm.wait(timeout=60) == 141
    assert isinstance(vm.error, ConsoleClosed)


def test_a_console_that_is_neither_file_nor_function_is_refused():
    with pytest.raises(UsageError, match=r"console=42 is neither a binary file"):
        Guest(guest("hello"), console=42)
