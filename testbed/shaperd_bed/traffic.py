"""Traffic through the bed: iperf3 TCP senders, the UDP flood, the RTT probe.

A measurement is a list of loads started together (each with its own start
offset) and waited for together:

* :class:`TcpLoad`  - ``iperf3 -c`` in a tenant pod with ``-P streams``, against
  a fresh one-off ``iperf3 -s -1`` in ``recv`` (one port per load); goodput is
  the receiver's ``end.sum_received``, samples are the server's intervals
  (with ``reverse``, ``-R``: ``recv`` sends, the pod receives, samples are the
  client's).
* :class:`UdpFlood` - :mod:`.udp` sender (UDP GSO, paced) plus counting sink.
* :class:`RttProbe` - iputils ``ping`` from a pod to ``recv``.

All processes go through the bed's :class:`~.procs.ProcessRegistry`; outputs
are written to files in the bed's workdir (no pipe can fill up and stall).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Union

from .netns import run
from .parse import IperfResult, RttStats, Sample, parse_iperf, parse_ping

if TYPE_CHECKING:  # pragma: no cover
    from .topology import Bed

UDP_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "udp.py")
IPERF3 = "iperf3"


@dataclass
class TcpLoad:
    tenant: str               # tenant short name ("a")
    streams: int = 4
    duration: float = 5.0
    start: float = 0.0        # seconds after the measurement starts
    interval: float = 0.1     # reporting interval (server and client)
    omit: float = 0.0         # iperf3 -O: seconds of warm-up left out of the totals
    label: str | None = None
    reverse: bool = False     # iperf3 -R: ``recv`` sends to the pod (what the pod receives from outside)

    @property
    def key(self) -> str:
        return self.label or self.tenant


@dataclass
class UdpFlood:
    tenant: str
    rate_bps: float
    duration: float = 5.0
    start: float = 0.0
    interval: float = 0.1
    label: str | None = None

    @property
    def key(self) -> str:
        return self.label or f"{self.tenant}-udp"


@dataclass
class RttProbe:
    tenant: str
    duration: float = 5.0
    start: float = 0.0
    every: float = 0.05       # ping -i
    label: str | None = None

    @property
    def key(self) -> str:
        return self.label or f"{self.tenant}-ping"


Load = Union[TcpLoad, UdpFlood, RttProbe]


@dataclass
class FloodResult:
    sent_bps: float
    received_bps: float
    samples: list[Sample]
    offset: float = 0.0

    def to_dict(self) -> dict:
        return {"sent_bps": self.sent_bps, "received_bps": self.received_bps, "offset": self.offset,
                "samples": [[s.start, s.end, round(s.bps)] for s in self.samples]}


class TrafficError(RuntimeError):
    """A traffic process failed or did not finish in time."""


def wait_listening(bed: "Bed", port: int, proto: str = "t", timeout: float = 5.0) -> None:
    """Wait until something listens on *port* in ``recv`` (``ss``)."""
    deadline = time.monotonic() + timeout
    flag = "-Hltn" if proto == "t" else "-Hlun"
    while time.monotonic() < deadline:
        out = run(["ss", flag, f"sport = :{port}"], bed.ns["recv"], check=False).stdout
        if out.strip():
            return
        time.sleep(0.02)
    raise TrafficError(f"nothing listening on port {port} in {bed.ns['recv']}")


def _fmt_num(x: float) -> str:
    return f"{x:g}"


def measure(bed: "Bed", loads: list[Load], *, name: str = "m", slack: float = 20.0
            ) -> dict[str, Union[IperfResult, FloodResult, RttStats]]:
    """Run *loads* concurrently and return results keyed by each load's ``key``."""
    seq = getattr(bed, "_measure_seq", 0) + 1
    bed._measure_seq = seq  # type: ignore[attr-defined]
    d = os.path.join(bed.workdir, f"{seq:03d}-{name}")
    os.makedirs(d, exist_ok=True)
    recv = bed.ns["recv"]
    servers: dict[str, tuple[subprocess.Popen, str]] = {}
    ports: dict[str, int] = {}
    port = 5201
    opened = []
    try:
        # 1. receivers
        for ld in loads:
            if isinstance(ld, TcpLoad):
                ports[ld.key] = port
                path = os.path.join(d, f"{ld.key}.server.json")
                f = open(path, "w")
                opened.append(f)
                p = bed.procs.spawn(bed.traffic_argv([IPERF3, "-s", "-1", "-J", "-p", str(port), "-i",
                                                      _fmt_num(ld.interval)]),
                                    recv, stdout=f, stderr=subprocess.STDOUT)
                servers[ld.key] = (p, path)
                port += 1
            elif isinstance(ld, UdpFlood):
                ports[ld.key] = 5301 + len(ports)
                path = os.path.join(d, f"{ld.key}.sink.json")
                f = open(path, "w")
                opened.append(f)
                p = bed.procs.spawn(bed.traffic_argv([sys.executable, UDP_SCRIPT, "sink", "--port",
                                                      str(ports[ld.key]), "--time",
                                                      _fmt_num(ld.start + ld.duration + 1.0),
                                                      "--interval", _fmt_num(ld.interval)]), recv, stdout=f,
                                    stderr=subprocess.STDOUT)
                servers[ld.key] = (p, path)
        for ld in loads:
            if isinstance(ld, TcpLoad):
                wait_listening(bed, ports[ld.key], "t")
            elif isinstance(ld, UdpFlood):
                wait_listening(bed, ports[ld.key], "u")
        # 2. senders, each at its offset
        clients: dict[str, tuple[subprocess.Popen, str, float]] = {}
        t0 = time.monotonic()
        for ld in sorted(loads, key=lambda x: x.start):
            delay = t0 + ld.start - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            pod = bed.pod_ns(ld.tenant)
            if isinstance(ld, TcpLoad):
                argv = [IPERF3, "-c", bed.recv_addr, "-p", str(ports[ld.key]), "-J",
                        "-t", _fmt_num(ld.duration), "-P", str(ld.streams), "-i", _fmt_num(ld.interval)]
                if ld.omit:
                    argv += ["-O", _fmt_num(ld.omit)]
                if ld.reverse:
                    argv.append("-R")
                if bed.config.sender_zerocopy:
                    argv.append("-Z")
                ext = "client.json"
            elif isinstance(ld, UdpFlood):
                argv = [sys.executable, UDP_SCRIPT, "send", "--dst", bed.recv_addr,
                        "--port", str(ports[ld.key]), "--rate-mbit", _fmt_num(ld.rate_bps / 1e6),
                        "--time", _fmt_num(ld.duration)]
                ext = "send.json"
            else:
                count = max(1, int(round(ld.duration / ld.every)))
                argv = ["ping", "-n", "-i", _fmt_num(ld.every), "-c", str(count), "-W", "1", bed.recv_addr]
                ext = "ping.txt"
            path = os.path.join(d, f"{ld.key}.{ext}")
            f = open(path, "w")
            opened.append(f)
            p = bed.procs.spawn(bed.traffic_argv(argv, ld.tenant), pod, stdout=f, stderr=subprocess.STDOUT)
            clients[ld.key] = (p, path, time.monotonic() - t0)
        # 3. wait
        horizon = max((ld.start + ld.duration + getattr(ld, "omit", 0.0)) for ld in loads) + slack
        deadline = t0 + horizon
        for key, (p, path, _) in list(clients.items()) + [(k, (p, path, 0.0)) for k, (p, path) in servers.items()]:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                bed.procs.stop(p)
                raise TrafficError(f"{key}: did not finish within {horizon:.0f}s (see {path})")
    finally:
        for f in opened:
            f.close()
    # 4. results
    results: dict[str, Union[IperfResult, FloodResult, RttStats]] = {}
    for ld in loads:
        p, cpath, offset = clients[ld.key]
        text = _read(cpath)
        if isinstance(ld, TcpLoad):
            spath = servers[ld.key][1]
            try:
                # -R: the client is the receiver; its own intervals are the receiver's samples
                res = parse_iperf(text, None if ld.reverse else (_read(spath) or None))
            except (ValueError, KeyError) as e:
                raise TrafficError(f"{ld.key}: cannot parse iperf3 output: {e}: {text[:300]!r}") from e
            res.offset = offset
            results[ld.key] = res
        elif isinstance(ld, UdpFlood):
            try:
                snd = json.loads(text.strip().splitlines()[-1])
                snk_lines = _read(servers[ld.key][1]).strip().splitlines()
                snk = json.loads(snk_lines[-1])
            except (ValueError, IndexError) as e:
                raise TrafficError(f"{ld.key}: bad flood output: {e}") from e
            samples = [Sample(a, b, r) for a, b, r in snk.get("samples", [])]
            # average only while the flood was running (sink outlives the sender)
            active = [s for s in samples if s.end <= snd["seconds"] + 1e-6] or samples
            secs = sum(s.seconds for s in active)
            rbps = sum(s.bits for s in active) / secs if secs else 0.0
            results[ld.key] = FloodResult(snd["bits_per_second"], rbps, samples, offset)
        else:
            results[ld.key] = parse_ping(text)
        bed.procs.forget(p)
    for p, _ in servers.values():
        bed.procs.forget(p)
    return results


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""
