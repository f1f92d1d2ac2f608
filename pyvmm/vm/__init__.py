"""One guest run: the plan, the runner, its counters, debugging and snapshots."""
