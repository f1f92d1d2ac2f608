"""``pyvmm --query-manifest KERNEL``: what a unikernel declares, without
running it (as ``solo5-elftool query-manifest``, plus the Solo5 ABI note
and pyvmm's capability note).

The JSON form is solo5-elftool's object (``type``, ``version``,
``devices`` with ``name`` and ``type``) with pyvmm's keys added: ``abi``,
``machine``, ``capabilities`` and, per device, the option that attaches it.
"""

from __future__ import annotations

import json

from pyvmm.devices import attaching_option, kinds
from pyvmm.loader import Manifest, parse_elf, read_abi, read_capabilities
from pyvmm.loader.kernel import _read_file


def describe(path: str, *, legacy: bool = True) -> dict:
    image = parse_elf(_read_file(path), path)
    abi = read_abi(image, legacy=legacy)
    manifest = Manifest.from_image(image)
    caps = read_capabilities(image)
    by_type = {kind.type: kind for kind in kinds()}
    devices = []
    for entry in manifest.devices():
        kind = by_type.get(entry.type)
        device = {"name": entry.name, "type": entry.type.solo5_name}
        if kind is not None:
            opt = attaching_option(kind)
            device["option"] = opt.spelled(entry.name, opt.metavar)
        devices.append(device)
    return {
        "type": "solo5.manifest",
        "version": 1,
        "devices": devices,
        "abi": {"target": abi.target_name, "version": abi.version},
        "machine": image.machine,
        "capabilities": {"user_mode": caps.user_mode, "shmstream": caps.shmstream},
    }


def query_manifest(path: str, *, as_json: bool = False, legacy: bool = True) -> str:
    facts = describe(path, legacy=legacy)
    if as_json:
        return json.dumps(facts, indent=2) + "\n"
    abi = facts["abi"]
    lines = [f"{path}: Solo5 {abi['target']} ABI version {abi['version']}, {facts['machine']}"]
    if abi["version"] == 1:
        lines[0] += " (Solo5 0.9 or older: boot it with --legacy-abi)"
    devices = facts["devices"]
    lines.append(f"devices ({len(devices)}):" if devices else "devices: none")
    width = max((len(d["name"]) for d in devices), default=0)
    types = max((len(d["type"]) for d in devices), default=0)
    for d in devices:
        lines.append(
            f"  {d['name']:<{width}}  {d['type']:<{types}}  {d.get('option', '')}".rstrip()
        )
    caps = facts["capabilities"]
    noted = [
        what
        for what, flag in (
            ("user mode (CPL 3, native speed on PVM hosts)", caps["user_mode"]),
            ("shmstream driver (pyvmm's ring network device)", caps["shmstream"]),
        )
        if flag
    ]
    if noted:
        lines.append("pyvmm capabilities: " + "; ".join(noted))
    else:
        lines.append(
            "pyvmm capabilities: none (no pyvmm note: runs at CPL 0, or deprivileged on PVM hosts)"
        )
    return "\n".join(lines) + "\n"
