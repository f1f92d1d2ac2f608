"""Host services: the seccomp sandbox and network namespaces."""
