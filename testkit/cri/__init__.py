"""containerd's CRI plugin for tests and benchmarks: a private containerd in
a network namespace of its own with CNI, a CRI v1 client generated at run
time from ``cri.proto``, and the Linux images a pod needs (docs/orchestration.md)."""
