"""UDP traffic for tests and benchmarks: ``python -m testkit.traffic``.

The sender is C (testkit/csrc/traffic.c, sendmmsg in batches) because a Python
loop cannot offer the guest more than a fraction of what one core can
send. Run it only inside a network namespace you created (testkit.netns):
it sends to whatever address it is given.

    python -m testkit.traffic DST_IP PORT [--count N] [--seconds S]
        [--size BYTES] [--rate PPS] [--batch N]

prints one JSON line: sent, refused, elapsed_s, pps.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from testkit.native import ffi, lib


def send(
    dst_ip: str,
    port: int,
    *,
    count: int = 0,
    seconds: float = 0.0,
    size: int = 1300,
    rate: int = 0,
    batch: int = 32,
    first_seq: int = 0,
) -> dict:
    result = ffi.new("struct traffic_result *")
    err = lib.traffic_udp_send(
        dst_ip.encode(), port, size, count, seconds, rate, batch, first_seq, result
    )
    if err:
        raise OSError(-err, os.strerror(-err))
    elapsed = result.elapsed_ns / 1e9
    return {
        "sent": result.sent,
        "refused": result.refused,
        "elapsed_s": round(elapsed, 6),
        "pps": round(result.sent / elapsed) if elapsed else 0,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description="UDP sender with udpsink's payload pattern")
    parser.add_argument("dst_ip")
    parser.add_argument("port", type=int)
    parser.add_argument("--count", type=int, default=0)
    parser.add_argument("--seconds", type=float, default=0.0)
    parser.add_argument("--size", type=int, default=1300, help="UDP payload bytes")
    parser.add_argument("--rate", type=int, default=0, help="datagrams/s, 0 = unpaced")
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args()
    if not args.count and not args.seconds:
        parser.error("give --count or --seconds")
    try:
        result = send(
            args.dst_ip,
            args.port,
            count=args.count,
            seconds=args.seconds,
            size=args.size,
            rate=args.rate,
            batch=args.batch,
        )
    except OSError as err:
        print(f"testkit.traffic: {err.strerror}", file=sys.stderr)
        return 1
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
