"""Boot the ping guest with shmstream networking on a tap in a throw-away
network namespace, ping it, and show what happened: the guest's output,
ping's, and pyvmm's counters (VM exits, frames through the rings). Nothing
is left behind: the namespace (and the tap in it) is removed at the end,
also on failure or Ctrl-C."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # testkit/ (the test and demo kit, not shipped)

from testkit.netns import NetNamespace  # noqa: E402

GUEST = ROOT / "guests" / "bin" / "ping.hvt"


def show_stats(stderr: str) -> None:
    """The counters pyvmm printed with --stats, in a few lines."""
    for line in stderr.splitlines():
        if not line.startswith("pyvmm-stats: "):
            print("  pyvmm| " + line)
            continue
        stats = json.loads(line.split(": ", 1)[1])
        exits = stats.get("kvm", {}).get("exits")
        print(
            f"# guest ran at CPL {stats['cpl']} for {stats['seconds']:.2f} s; VM exits: "
            f"{exits} counted by KVM, {sum(stats['exits_to_pyvmm'].values())} reached pyvmm"
        )
        shm = stats.get("shmstream")
        if shm:
            for name, dev in shm["devices"].items():
                print(
                    f"# shmstream ({shm['mode']}) {name}: {dev['rx_frames']} frames in, "
                    f"{dev['tx_frames']} out, {dev['notify_sent']} guest wake-ups, "
                    f"drops {dev['rx_drops_full']}"
                )


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
