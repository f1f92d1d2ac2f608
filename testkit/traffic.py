"""UDP traffic for tests and benchmarks: ``python -m testkit.traffic``.

The sender is C (testkit/csrc/traffic.c, sendmmsg in batches) because a Python
loop cannot offer the guest more than a fraction of what one core can
send. Run it only inside a network namespace you created (testkit.netns):
it sends to whatever address it is given.

    python -m testkit.traffic DST_IP PORT [--count N] [--seconds S]
        [--size BYTES] [--rate PPS] [--batch N] [--sockets N]
        [--sndbuf BYTES] [--cpu N] [--packet IFNAME --src-ip IP --dst-mac MAC]

prints one JSON line: sent, refused, elapsed_s, pps (accepted per second),
offered_pps (accepted and refused), cpu_s (the sender's own CPU time),
calls (sendmmsg calls).  --packet injects Ethernet frames with AF_PACKET on
IFNAME (the tap), bypassing the host's IP and UDP stack and the qdisc; the
tap's refusals then come back as ``refused``.

    python -m testkit.traffic --recv BIND_IP PORT [--count N] [--idle-ms MS] [--seconds S]

counts the datagrams arriving (udpsink's pattern checked) and prints
received, bytes, pattern_errors, out_of_order, elapsed_s (first to last),
pps, cpu_s.  ``ready`` is printed on stderr once the socket is bound.

    python -m testkit.traffic --rtt N DST_IP PORT [--size BYTES] [--interval-us US]

sends N datagrams to an echo one at a time and prints the round trips:
answered, lost, rtt_us (every one, 0 = lost).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys

from testkit.native import ffi, lib


def _check(err: int) -> None:
    if err < 0:
        raise OSError(-err, os.strerror(-err))


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
    sockets: int = 1,
    sndbuf: int = 0,
    cpu: int = -1,
    packet: str | None = None,
    src_ip: str | None = None,
    src_mac: str | None = None,
    dst_mac: str | None = None,
    qdisc: bool = False,
) -> dict:
    opts = ffi.new("struct traffic_opts *")
    keep = [ffi.new("char[]", dst_ip.encode())]
    opts.dst_ip = keep[0]
    opts.port = port
    opts.payload = size
    opts.count = count
    opts.seconds = seconds
    opts.rate_pps = rate
    opts.batch = batch
    opts.first_seq = first_seq
    opts.sockets = sockets
    opts.sndbuf = sndbuf
    opts.cpu = cpu
    opts.qdisc = int(qdisc)
    if packet:
        if not (src_ip and dst_mac):
            raise ValueError("AF_PACKET injection needs src_ip and dst_mac")
        opts.ifindex = socket.if_nametoindex(packet)
        keep.append(ffi.new("char[]", src_ip.encode()))
        opts.src_ip = keep[-1]
        opts.dst_mac = list(bytes.fromhex(dst_mac.replace(":", "")))
        opts.src_mac = list(bytes.fromhex((src_mac or "02:00:00:00:00:01").replace(":", "")))
    result = ffi.new("struct traffic_result *")
    _check(lib.traffic_send(opts, result))
    elapsed = result.elapsed_ns / 1e9
    return {
        "sent": result.sent,
        "refused": result.refused,
        "elapsed_s": round(elapsed, 6),
        "pps": round(result.sent / elapsed) if elapsed else 0,
        "offered_pps": round((result.sent + result.refused) / elapsed) if elapsed else 0,
        "cpu_s": round(result.cpu_ns / 1e9, 6),
        "calls": result.calls,
    }


def receive(
    bind_ip: str,
    port: int,
    *,
    count: int = 0,
    idle_ms: int = 1000,
    seconds: float = 60.0,
    ready_fd: int = -1,
) -> dict:
    result = ffi.new("struct traffic_recv_result *")
    _check(lib.traffic_udp_recv(bind_ip.encode(), port, count, idle_ms, seconds, ready_fd, result))
    elapsed = (result.last_ns - result.first_ns) / 1e9
    return {
        "received": result.received,
        "bytes": result.bytes,
        "pattern_errors": result.pattern_errors,
        "out_of_order": result.out_of_order,
        "elapsed_s": round(elapsed, 6),
        "pps": round(result.received / elapsed) if elapsed > 0 else 0,
        "cpu_s": round(result.cpu_ns / 1e9, 6),
    }


def round_trips(
    dst_ip: str,
    port: int,
    count: int,
    *,
    size: int = 64,
    warmup: int = 20,
    interval_us: int = 1000,
    timeout_ms: int = 200,
) -> list[float]:
    """Round trips in microseconds, one per request; 0.0 = no answer."""
    rtt = ffi.new("uint64_t[]", count)
    got = lib.traffic_udp_rtt(
        dst_ip.encode(), port, size, count, warmup, interval_us, timeout_ms, rtt
    )
    _check(got)
    return [rtt[i] / 1000 for i in range(count)]


def main() -> int:
    parser = argparse.ArgumentParser(description="UDP sender with udpsink's payload pattern")
    parser.add_argument("dst_ip")
    parser.add_argument("port", type=int)
    parser.add_argument("--count", type=int, default=0)
    parser.add_argument("--seconds", type=float, default=0.0)
    parser.add_argument("--size", type=int, default=1300, help="UDP payload bytes")
    parser.add_argument("--rate", type=int, default=0, help="datagrams/s, 0 = unpaced")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--sockets", type=int, default=1, help="UDP sockets, round-robin")
    parser.add_argument("--sndbuf", type=int, default=0, help="SO_SNDBUFFORCE bytes")
    parser.add_argument("--cpu", type=int, default=-1, help="pin the sender to this CPU")
    parser.add_argument("--packet", metavar="IFNAME", help="AF_PACKET injection on IFNAME")
    parser.add_argument("--qdisc", action="store_true", help="--packet: through the qdisc")
    parser.add_argument("--src-ip")
    parser.add_argument("--src-mac")
    parser.add_argument("--dst-mac")
    parser.add_argument("--recv", action="store_true", help="count what arrives at DST_IP:PORT")
    parser.add_argument("--idle-ms", type=int, default=1000, help="--recv: stop when idle")
    parser.add_argument("--rtt", type=int, default=0, metavar="N", help="N round trips")
    parser.add_argument("--interval-us", type=int, default=1000, help="--rtt: pacing")
    args = parser.parse_args()
    try:
        if args.recv:
            result = receive(
                args.dst_ip,
                args.port,
                count=args.count,
                idle_ms=args.idle_ms,
                seconds=args.seconds or 60.0,
                ready_fd=sys.stderr.fileno(),
            )
        elif args.rtt:
            rtt = round_trips(
                args.dst_ip, args.port, args.rtt, size=args.size, interval_us=args.interval_us
            )
            answered = sum(1 for r in rtt if r)
            result = {"answered": answered, "lost": len(rtt) - answered, "rtt_us": rtt}
        else:
            if not args.count and not args.seconds:
                parser.error("give --count or --seconds")
            result = send(
                args.dst_ip,
                args.port,
                count=args.count,
                seconds=args.seconds,
                size=args.size,
                rate=args.rate,
                batch=args.batch,
                sockets=args.sockets,
                sndbuf=args.sndbuf,
                cpu=args.cpu,
                packet=args.packet,
                src_ip=args.src_ip,
                src_mac=args.src_mac,
                dst_mac=args.dst_mac,
                qdisc=args.qdisc,
            )
    except (OSError, ValueError) as err:
        print(f"testkit.traffic: {getattr(err, 'strerror', None) or err}", file=sys.stderr)
        return 1
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
