"""The launcher's API described as OpenAPI 3.1 (GET /openapi.json).

Built from routes.py's table, so a path the launcher serves is a path
described, and tests/test_serve.py checks the live launcher's answers
against these schemas. Errors all have one shape (``Error``).
"""

from __future__ import annotations

from typing import Any

from pyvmm import __version__
from pyvmm.serve.events import TIME_KEYS
from pyvmm.serve.routes import API_VERSION, ROUTES

_STRINGS = {"type": "array", "items": {"type": "string"}}
_PATH = {"type": "string", "minLength": 1, "maxLength": 4095}
_SIGNAL = {"type": "string", "enum": ["SIGINT", "SIGTERM", "SIGHUP", "SIGKILL"]}
_MICROSECONDS = {"type": "object", "additionalProperties": {"type": "number"}}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


SCHEMAS: dict[str, Any] = {
    "Error": {
        "description": "Every error: the one line the command would print, and the exit "
        "status of the VM it is about if that VM ended (else null).",
        "type": "object",
        "required": ["error", "exit_status"],
        "additionalProperties": False,
        "properties": {
            "error": {"type": "string"},
            "exit_status": {"type": ["integer", "null"], "minimum": 0, "maximum": 255},
        },
    },
    "Info": {
        "type": "object",
        "required": ["pyvmm", "api", "pid", "vms", "limits"],
        "additionalProperties": False,
        "properties": {
            "pyvmm": {"type": "string", "description": "pyvmm's version"},
            "api": {"const": API_VERSION},
            "pid": {"type": "integer"},
            "vms": {"type": "integer", "description": "VMs known (running and ended)"},
            "limits": {
                "type": "object",
                "required": [
                    "max_vms",
                    "max_pools",
                    "max_connections",
                    "request_timeout",
                    "allow_uids",
                ],
                "additionalProperties": False,
                "properties": {
                    "max_vms": {"type": "integer", "minimum": 1},
                    "max_pools": {"type": "integer", "minimum": 1},
                    "max_connections": {"type": "integer", "minimum": 1},
                    "request_timeout": {"type": "number", "exclusiveMinimum": 0},
                    "allow_uids": {"type": "array", "items": {"type": "integer"}},
                },
            },
        },
    },
    "CreateVm": {
        "type": "object",
        "anyOf": [{"required": ["argv"]}, {"required": ["restore"]}],
        "additionalProperties": False,
        "properties": {
            "argv": {
                **_STRINGS,
                "description": "the command line after `pyvmm`; with restore, the devices' options",
            },
            "restore": {**_PATH, "description": "a snapshot to resume (--restore=DIR)"},
            "id": {"type": "string", "pattern": "^[A-Za-z0-9_.-]{1,64}$"},
            "cwd": {**_PATH, "description": "where relative paths are taken from"},
            "stdout": {**_PATH, "description": "the guest's console, appended to"},
            "stderr": {**_PATH, "description": "pyvmm's lines, appended to"},
            "wait": {"type": "boolean", "description": "answer once the VM has ended"},
        },
    },
    "Vm": {
        "type": "object",
        "required": ["id", "pid", "state", "kernel", "argv", "exit_status", "start_latency_us"],
        "additionalProperties": False,
        "properties": {
            "id": {"type": "string"},
            "pid": {"type": "integer"},
            "state": {"type": "string", "enum": ["starting", "ready", "running", "exited"]},
            "kernel": {"type": "string"},
            "argv": _STRINGS,
            "exit_status": {"type": ["integer", "null"], "minimum": 0, "maximum": 255},
            "start_latency_us": {"type": ["number", "null"]},
            "start_us": {
                **_MICROSECONDS,
                "propertyNames": {"enum": sorted(TIME_KEYS)},
                "description": "start-up steps, from the request's first byte",
            },
            "start_cpu_us": {
                **_MICROSECONDS,
                "propertyNames": {"enum": ["launcher", "child"]},
            },
            "pooled": {"const": True},
            "signal": {"type": "string", "description": "the signal that ended it"},
            "error": {"type": "string", "description": "the line the command would print"},
            "imported_after_fork": _STRINGS,
        },
    },
    "VmList": {
        "type": "object",
        "required": ["vms"],
        "additionalProperties": False,
        "properties": {"vms": {"type": "array", "items": _ref("Vm")}},
    },
    "Stop": {
        "type": "object",
        "additionalProperties": False,
        "properties": {"signal": {**_SIGNAL, "default": "SIGTERM"}},
    },
    "Stats": {
        "description": "The counters, as --stats-json writes them (docs/stats.md).",
        "type": "object",
        "required": ["schema"],
        "properties": {"schema": {"const": "pyvmm-stats/1"}},
    },
    "CreatePool": {
        "type": "object",
        "anyOf": [{"required": ["argv"]}, {"required": ["restore"]}],
        "additionalProperties": False,
        "properties": {
            "argv": _STRINGS,
            "restore": {**_PATH, "description": "clones of this snapshot"},
            "cwd": _PATH,
            "size": {"type": "integer", "minimum": 1, "maximum": 16, "default": 1},
        },
    },
    "Pool": {
        "type": "object",
        "required": ["argv", "cwd", "size", "ready", "preparing", "error"],
        "additionalProperties": False,
        "properties": {
            "argv": _STRINGS,
            "cwd": {"type": ["string", "null"]},
            "size": {"type": "integer"},
            "ready": {"type": "integer"},
            "preparing": {"type": "integer"},
            "error": {"type": ["string", "null"]},
        },
    },
    "Pools": {
        "type": "object",
        "required": ["pools"],
        "additionalProperties": False,
        "properties": {"pools": {"type": "array", "items": _ref("Pool")}},
    },
    "Snapshot": {
        "type": "object",
        "required": ["dir"],
        "additionalProperties": False,
        "properties": {
            "dir": {
                **_PATH,
                "description": "the new directory, an absolute path (never an existing one)",
            },
            "stop": {
                "type": "boolean",
                "default": False,
                "description": "end the VM (status 0) once it is written",
            },
        },
    },
    "SnapshotTaken": {
        "type": "object",
        "required": ["dir", "pages", "memory_bytes", "stop", "ms", "vm"],
        "additionalProperties": False,
        "properties": {
            "dir": {"type": "string"},
            "pages": {"type": "integer", "description": "memory pages written (not zero)"},
            "memory_bytes": {"type": "integer", "description": "guest memory (the file's size)"},
            "stop": {"type": "boolean"},
            "ms": {"type": "number", "description": "from the request to the files synced"},
            "vm": _ref("Vm"),
        },
    },
    "CreateContainer": {
        "description": "pyvmm-oci's warm create: the container's VM prepared from its "
        "bundle and held until POST /vms/ID/start (root and the launcher's user only)",
        "type": "object",
        "required": ["bundle", "id", "root", "vm"],
        "additionalProperties": False,
        "properties": {
            "bundle": {**_PATH, "description": "the OCI bundle, an absolute path"},
            "id": {"type": "string", "description": "the container's id"},
            "root": {**_PATH, "description": "pyvmm-oci's state directory (--root)"},
            "vm": {"type": "string", "pattern": "^[A-Za-z0-9_.-]{1,64}$"},
            "systemd_cgroup": {"type": "boolean", "default": False},
            "debug": {"type": "boolean", "default": False},
        },
    },
    "Start": {
        "type": "object",
        "additionalProperties": False,
        "properties": {"wait": {"type": "boolean", "description": "answer once it has ended"}},
    },
    "OpenApi": {"type": "object", "required": ["openapi", "paths"]},
}

#: operation -> (summary, request body schema or None, {status: (description, schema)}).
OPERATIONS: dict[str, tuple[str, str | None, dict[str, tuple[str, str]]]] = {
    "info": ("The launcher: version, pid, limits", None, {"200": ("the launcher", "Info")}),
    "openapi": ("This document", None, {"200": ("OpenAPI 3.1", "OpenApi")}),
    "list_vms": ("Every VM known (the last 256 ended ones kept)", None, {"200": ("", "VmList")}),
    "create_vm": (
        "Start a VM with the command's options (from a pool if one matches)",
        "CreateVm",
        {
            "201": ("its guest is about to run its first instruction", "Vm"),
            "200": ('with "wait": true, once it has ended', "Vm"),
        },
    ),
    "get_vm": ("One VM", None, {"200": ("", "Vm")}),
    "delete_vm": (
        "Stop a VM (if it runs) and forget it",
        "Stop",
        {"200": ("once it has ended", "Vm")},
    ),
    "stop_vm": (
        "Stop a VM with a signal (SIGKILL 10 s later)",
        "Stop",
        {"200": ("once it has ended", "Vm")},
    ),
    "wait_vm": ("Wait for a VM's end", None, {"200": ("once it has ended", "Vm")}),
    "vm_stats": ("A VM's counters (the final ones once it ended)", None, {"200": ("", "Stats")}),
    "snapshot_vm": (
        "Write a snapshot of a running VM to a new directory; the guest runs on or stops",
        "Snapshot",
        {"200": ("written and synced", "SnapshotTaken")},
    ),
    "start_vm": (
        "Start a held VM (a container's) with the console fds passed",
        "Start",
        {"200": ('its guest runs (with "wait": true, once it has ended)', "Vm")},
    ),
    "create_container": (
        "Prepare an OCI container's VM from its bundle, held until its start (501: the "
        "warm path does not take it, the cold create will)",
        "CreateContainer",
        {"201": ("prepared, waiting for its start", "Vm")},
    ),
    "list_pools": ("The pools", None, {"200": ("", "Pools")}),
    "create_pool": (
        "Prepare VMs ahead for a command line",
        "CreatePool",
        {"201": ("the pool", "Pool")},
    ),
    "delete_pools": ("End every prepared VM, forget the pools", None, {"200": ("", "Pools")}),
}

_ERRORS = {
    "default": {
        "description": "an error (400 bad request or the command's error line, 403 a user "
        "not allowed, 404, 405, 408 a request too slow, 409, 413 too large, 500, "
        "503 a limit reached or the launcher stopping, 504)",
        "content": {"application/json": {"schema": _ref("Error")}},
    }
}


def _operation(name: str) -> dict[str, Any]:
    summary, request, answers = OPERATIONS[name]
    responses: dict[str, Any] = {
        status: {
            "description": description or summary,
            "content": {"application/json": {"schema": _ref(schema)}},
        }
        for status, (description, schema) in answers.items()
    }
    responses.update(_ERRORS)
    operation: dict[str, Any] = {"operationId": name, "summary": summary, "responses": responses}
    if request is not None:
        operation["requestBody"] = {
            "required": name in ("create_vm", "create_pool", "snapshot_vm"),
            "content": {"application/json": {"schema": _ref(request)}},
        }
    return operation


def document() -> dict[str, Any]:
    """The whole description, as served."""
    paths: dict[str, Any] = {}
    for (method, template), name in ROUTES.items():
        item = paths.setdefault(template, {})
        if "{id}" in template:
            item["parameters"] = [
                {"name": "id", "in": "path", "required": True, "schema": {"type": "string"}}
            ]
        item[method.lower()] = _operation(name)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "pyvmm serve",
            "version": __version__,
            "description": "The warm launcher's API, HTTP/1.1 over a Unix socket, one "
            "request per connection (docs/serve.md). Every path is also served without "
            f"the /{API_VERSION} prefix.",
        },
        "servers": [
            {"url": f"http://localhost/{API_VERSION}"},
            {"url": "http://localhost", "description": "the same paths, unversioned"},
        ],
        "paths": paths,
        "components": {"schemas": SCHEMAS},
    }
