"""Standalone UDP flood sender and counting sink (run as a script in a netns).

iperf3 3.12 is single-threaded and tops out near 1 Gbit/s of 1448-byte UDP on
this class of VM, so the bed's 2x-link-rate flood uses UDP GSO (UDP_SEGMENT):
each ``send`` hands the kernel up to 64 KiB that leave as MTU-sized datagrams
(1448-byte payloads), paced in 1 ms slots to the requested rate.  The sink
enables UDP_GRO and counts bytes per interval.  Both print one JSON object.

This file imports nothing from the package so it can be run by path::

    python udp.py send --dst 198.18.254.2 --port 5301 --rate-mbit 2000 --time 5
    python udp.py sink --port 5301 --time 6 --interval 0.1
"""
from __future__ import annotations

import argparse
import json
import signal
import socket
import sys
import time

SOL_UDP = 17
UDP_SEGMENT = 103
UDP_GRO = 104


def send(dst: str, port: int, rate_bps: float, duration: float, payload: int = 1448,
         chunk_segments: int = 44) -> dict:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    gso = True
    try:
        s.setsockopt(SOL_UDP, UDP_SEGMENT, payload)
    except OSError:
        gso = False
        chunk_segments = 1
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
    s.connect((dst, port))
    buf = bytes(payload * chunk_segments)
    slot = 0.001
    per_slot = rate_bps / 8 * slot
    sent = errors = 0
    t0 = time.monotonic()
    next_slot = t0
    credit = 0.0
    while True:
        now = time.monotonic()
        if now - t0 >= duration:
            break
        if now < next_slot:
            time.sleep(next_slot - now)
            continue
        credit += per_slot
        next_slot += slot
        if next_slot < now - 0.05:  # fell far behind: don't try to catch up in one go
            next_slot = now
        while credit >= len(buf):
            try:
                sent += s.send(buf)
            except OSError:
                errors += 1
            credit -= len(buf)
    elapsed = time.monotonic() - t0
    return {"role": "send", "gso": gso, "bytes": sent, "seconds": elapsed,
            "bits_per_second": sent * 8 / elapsed if elapsed else 0.0, "errors": errors,
            "payload": payload}


def sink(port: int, duration: float, interval: float, bind: str = "0.0.0.0") -> dict:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.setsockopt(SOL_UDP, UDP_GRO, 1)
    except OSError:
        pass
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    s.bind((bind, port))
    s.settimeout(0.05)
    buf = bytearray(1 << 17)
    samples = []
    total = 0
    first = None
    t_end = time.monotonic() + duration
    cur_start = None
    cur = 0
    print(json.dumps({"role": "sink", "ready": True}), flush=True)
    while time.monotonic() < t_end:
        try:
            n = s.recv_into(buf)
        except socket.timeout:
            n = 0
        now = time.monotonic()
        if n:
            if first is None:
                first = cur_start = now
            total += n
        if cur_start is not None:
            while now - cur_start >= interval:
                samples.append([round(cur_start - first, 4), round(cur_start - first + interval, 4),
                                cur * 8 / interval])
                cur_start += interval
                cur = 0
            if n:
                cur += n
    seconds = (samples[-1][1] if samples else 0.0)
    in_samples = sum(x[2] * (x[1] - x[0]) / 8 for x in samples)
    return {"role": "sink", "bytes": total, "seconds": seconds,
            "bits_per_second": in_samples * 8 / seconds if seconds else 0.0, "samples": samples}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="role", required=True)
    ps = sub.add_parser("send")
    ps.add_argument("--dst", required=True)
    ps.add_argument("--port", type=int, required=True)
    ps.add_argument("--rate-mbit", type=float, required=True)
    ps.add_argument("--time", type=float, required=True)
    ps.add_argument("--payload", type=int, default=1448)
    pk = sub.add_parser("sink")
    pk.add_argument("--port", type=int, required=True)
    pk.add_argument("--time", type=float, required=True)
    pk.add_argument("--interval", type=float, default=0.1)
    a = p.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    if a.role == "send":
        out = send(a.dst, a.port, a.rate_mbit * 1e6, a.time, a.payload)
    else:
        out = sink(a.port, a.time, a.interval)
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
