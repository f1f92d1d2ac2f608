"""The Solo5 hvt ABI on the host side: boot info, hypercalls, the run loop."""
