"""Boot the ping guest with shmstream networking on a tap in a throw-away
network namespace, ping it, and show what happened: the guest's output,
ping's, and pyvmm's counters (VM exits, frames through the rings). Nothing
is left behind: the namespace (and the tap in it) is removed at the end,
also on failure or Ctrl-C."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # testkit/ (the test and demo kit, not shipped)

from testkit.netns import NetNamespace  # noqa: E402

GUEST = ROOT / "guests" / "bin" / "ping.hvt"


def show_stats(stderr: str) -> None:
    """What pyvmm printed on stderr: with --stats, its counters' summary."""
    for line in stderr.splitlines():
        print("  pyvmm| " + line)


def main() -> int:
    command = [
        "pyvmm",
        "--net=tap100",
        "--shm=poll",
        "--stats",
        str(GUEST.relative_to(ROOT)),
        "10.0.0.2",
        "5",
    ]
    with NetNamespace() as ns:
        ns.add_tap("tap100", address="10.0.0.1/24")
        print(f"# namespace {ns.name}: tap100 10.0.0.1/24; guest 10.0.0.2")
        print("$ " + " ".join(command))
        vm, head = ns.start_pyvmm(*command[1:], cwd=ROOT)
        for line in head.splitlines():
            print("  guest| " + line)
        print("$ ping -c 5 -i 0.2 10.0.0.2")
        ping = ns.run(["ping", "-c", "5", "-i", "0.2", "10.0.0.2"], capture_output=True, text=True)
        for line in ping.stdout.splitlines():
            print("  ping | " + line)
        for line in vm.stdout:
            print("  guest| " + line, end="")
        vm.wait(timeout=30)
        print(f"# pyvmm exited with status {vm.returncode}")
        show_stats(vm.stderr.read())
        return 0 if vm.returncode == 0 and ping.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
