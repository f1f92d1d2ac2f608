"""pyvmm-oci's create, read without argparse in the shim's plain forms
(runtime.quick_create), reads as the parser reads it; every other form is
left to the parser."""

from __future__ import annotations

import pytest

from pyvmm.oci import runtime

SHIM = ["--root", "/run/containerd/runc/k8s.io", "--log", "/b/log.json", "--log-format", "json"]
CREATE = ["create", "--bundle", "/b", "--pid-file", "/b/init.pid"]

TAKEN = [
    [*SHIM, *CREATE, "c1"],
    [*SHIM, *CREATE, "--console-socket", "/tmp/pty.sock", "c1"],
    [*SHIM, "--systemd-cgroup", "--debug", *CREATE, "c1"],
    ["--root=/r", "--log=/l", "--log-format=text", "create", "--bundle=/b", "c1"],
    ["create", "-b", "/b", "--no-pivot", "--no-new-keyring", "c1"],
    ["--rootless=false", "--criu", "/usr/sbin/criu", "create", "c1"],
    ["--log", "create", "create", "create"],  # a value, the command, the id
    ["create", "c1"],
]

LEFT = [
    ["--help"],
    ["--version"],
    ["-v", "create", "c1"],
    ["create"],
    ["create", "c1", "c2"],
    ["create", "--preserve-fds", "3", "c1"],
    ["--log-format", "xml", "create", "c1"],
    ["create", "--bundle", "-x", "c1"],
    ["create", "--bundle"],
    ["--debug=1", "create", "c1"],
    ["create", "--root", "/r", "c1"],
    ["create", "--bund", "/b", "c1"],
    ["--root=", "create", "c1"],
    ["create", "-c1"],
    ["state", "c1"],
    ["create", "--bogus", "c1"],
]


@pytest.mark.parametrize("argv", TAKEN, ids=" ".join)
def test_the_shim_s_forms_read_as_the_parser_reads_them(argv):
    quick = runtime.quick_create(argv)
    assert quick is not None
    parsed, extra = runtime.parser().parse_known_args(argv)
    assert extra == []
    assert vars(quick) == vars(parsed)


@pytest.mark.parametrize("argv", LEFT, ids=" ".join)
def test_every_other_form_is_left_to_the_parser(argv):
    assert runtime.quick_create(argv) is None
