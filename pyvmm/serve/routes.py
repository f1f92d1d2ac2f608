"""The launcher's paths: a request's method and path -> what it asks for.

One table, so that the server's dispatch, the OpenAPI document
(openapi.py) and the tests agree on what exists. Every path is served
under the API's version prefix (``/v1/vms``) and without it (``/vms``),
the unversioned form kept for the clients that came before the prefix.
"""

from __future__ import annotations

from pyvmm.serve.http import HttpError

#: The API's version, the first segment of a versioned path.
API_VERSION = "v1"

#: (method, path template) -> the operation's name.
ROUTES: dict[tuple[str, str], str] = {
    ("GET", "/"): "info",
    ("GET", "/openapi.json"): "openapi",
    ("GET", "/vms"): "list_vms",
    ("POST", "/vms"): "create_vm",
    ("GET", "/vms/{id}"): "get_vm",
    ("DELETE", "/vms/{id}"): "delete_vm",
    ("POST", "/vms/{id}/stop"): "stop_vm",
    ("GET", "/vms/{id}/wait"): "wait_vm",
    ("GET", "/vms/{id}/stats"): "vm_stats",
    ("POST", "/vms/{id}/start"): "start_vm",
    ("POST", "/containers"): "create_container",
    ("POST", "/vms/{id}/snapshot"): "snapshot_vm",
    ("GET", "/pool"): "list_pools",
    ("POST", "/pool"): "create_pool",
    ("DELETE", "/pool"): "delete_pools",
}

_TEMPLATES = {template for _, template in ROUTES}


def template_of(path: str) -> tuple[str, str | None]:
    """(the path's template, the VM id in it) or 404; the version prefix,
    if present, is dropped."""
    parts = [p for p in path.split("/") if p]
    if parts[:1] == [API_VERSION]:
        parts = parts[1:]
    vm_id = None
    if len(parts) >= 2 and parts[0] == "vms":
        vm_id, parts = parts[1], ["vms", "{id}", *parts[2:]]
    template = "/" + "/".join(parts)
    if template not in _TEMPLATES:
        raise HttpError(404, f"no such resource: {path[:200]}")
    return template, vm_id


def route(method: str, path: str) -> tuple[str, str | None]:
    """(operation, VM id) for a request, or HttpError 404 / 405."""
    template, vm_id = template_of(path)
    operation = ROUTES.get((method, template))
    if operation is None:
        allowed = " or ".join(m for m, t in ROUTES if t == template)
        raise HttpError(405, f"{method[:20]} {path[:200]}: use {allowed}")
    return operation, vm_id
