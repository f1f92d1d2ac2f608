"""pyvmm under containerd and Kubernetes (docs/orchestration.md).

- ``runtime``: ``pyvmm-oci``, a runc-compatible OCI runtime for the
  subset of runc's command line containerd's runc shim uses;
- ``bundle``: an OCI bundle's config.json and rootfs to a pyvmm command;
- ``network``: a tap wired to the CNI interface with tc redirects;
- ``image``: ``python3 -m pyvmm.oci.image``, a unikernel packed into an OCI
  image archive for ``ctr image import``.
"""
