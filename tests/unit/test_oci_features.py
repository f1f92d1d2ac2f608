"""pyvmm-oci features: each claim is what the runtime does."""

from __future__ import annotations

import json
import subprocess
import sys

from pyvmm.oci import bundle, cgroups, runtime, warm


def test_features_prints_the_feature_set_as_json():
    done = subprocess.run(
        [sys.executable, "-m", "pyvmm.oci", "features"], capture_output=True, text=True, check=True
    )
    assert json.loads(done.stdout) == runtime.feature_set()


def test_every_annotation_that_changes_what_runs_is_called_unsafe():
    unsafe = runtime.feature_set()["potentiallyUnsafeConfigAnnotations"]
    read = [
        bundle.BINARY,
        bundle.TYPE,
        bundle.NET_ARGS,
        bundle.BLOCK + "disk",
        bundle.URUNC_BINARY,
        bundle.URUNC_HYPERVISOR,
        "org.pyvmm.launcher",  # the warm path's (csrc/oci_warm.h)
        "org.pyvmm.trace",
    ]
    for key in read:
        assert any(key.startswith(prefix) for prefix in unsafe), key
    assert all(prefix.endswith(".") for prefix in unsafe)


def test_no_hooks_no_mounts_and_only_the_network_namespace():
    linux = runtime.feature_set()["linux"]
    assert runtime.feature_set()["hooks"] == [] and runtime.feature_set()["mountOptions"] == []
    assert linux["namespaces"] == ["network"]
    assert linux["seccomp"] == {"enabled": False}


def test_the_cgroup_claims_name_what_the_cgroup_module_does():
    claims = runtime.feature_set()["linux"]["cgroup"]
    assert claims["v1"] and claims["v2"] and claims["systemd"]
    assert not claims["systemdUser"] and not claims["rdma"]
    assert cgroups.systemd_path("kubepods.slice:cri-containerd:abc").endswith(
        "cri-containerd-abc.scope"
    )
    assert "rdma" not in " ".join(cgroups.V1_CONTROLLERS)
    assert warm.KEYS >= {"systemd_cgroup"}  # the warm path takes the driver too
