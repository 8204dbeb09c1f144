"""Names, addresses and lifetime of the bed's namespaces and veth pairs.

Topology (one netns each, all names prefixed by a per-run id)::

    pod-a  (198.18.1.2/24) --veth--+
                                   node (ip_forward=1) --uplink veth--> wire --veth--> recv
    pod-b  (198.18.2.2/24) --veth--+      HTB here           TBF on its egress   iperf3 -s

* ``node`` is the shaped host: shaperd (or hand ``tc``) programs its uplink.
* ``wire`` emulates the physical NIC's fixed capacity: a TBF at the link rate
  on its egress towards ``recv``.  ACKs flow back unshaped (with
  ``BedConfig.inbound_link``, the same TBF towards the node, for traffic to the pods).
* ``recv`` runs the iperf3 servers (one port per tenant and measurement).

Namespaces, veths, processes and their removal are :mod:`.netns`'s (one
:class:`~.netns.Namespaces` per bed).  Every veth is created directly inside
its namespaces, so nothing ever appears in the root namespace; IPv6 is
disabled in the bed's namespaces.  Teardown kills every process the bed
started, then anything still inside its namespaces, then deletes the
namespaces (which deletes the veths).  The
:class:`Bed` context manager also turns SIGTERM (and SIGHUP) into an exception
while it is active so that teardown runs on ``kill`` as well as on Ctrl-C.
"""
from __future__ import annotations

import logging
import os
import secrets
import signal
import threading
from dataclasses import dataclass, field

from . import netns
from .netns import IP, TC, list_netns, run

log = logging.getLogger(__name__)

NS_PREFIX = "shb-"
MBIT = 1_000_000


class BedInterrupted(BaseException):
    """Raised inside the bed's context when SIGTERM/SIGHUP arrives."""

    def __init__(self, signum: int):
        self.signum = signum
        super().__init__(f"interrupted by signal {signum}")


@dataclass(frozen=True)
class TenantSpec:
    """One tenant: shaping parameters as fractions of the link, and its pod."""

    name: str            # "tenant-a"
    short: str           # "a": used in netns/interface names
    subnet_octet: int    # pod prefix 198.18.<octet>.0/24
    guarantee: float     # fraction of link capacity
    limit: float         # fraction of link capacity
    priority: int        # shaperd priority (higher = more important)
    port: int            # iperf3 server port in recv

    @property
    def cidr(self) -> str:
        return f"198.18.{self.subnet_octet}.0/24"

    @property
    def pod_addr(self) -> str:
        return f"198.18.{self.subnet_octet}.2"

    @property
    def gw_addr(self) -> str:
        return f"198.18.{self.subnet_octet}.1"


def default_tenants() -> tuple[TenantSpec, ...]:
    """Tenant A: 40 %/60 %, prio 100; tenant B: 20 %/40 %, prio 50."""
    return (
        TenantSpec("tenant-a", "a", 1, 0.40, 0.60, 100, 5201),
        TenantSpec("tenant-b", "b", 2, 0.20, 0.40, 50, 5202),
    )


@dataclass
class BedConfig:
    """What the bed is built with.  ``link_mbit`` is the wire's TBF rate."""

    link_mbit: int = 1000
    tenants: tuple[TenantSpec, ...] = field(default_factory=default_tenants)
    # TBF of the emulated NIC: bucket (bytes) and queue (as time at link rate).
    tbf_burst_bytes: int | None = None   # default: max(64 KiB + MTU, 1 ms at rate)
    tbf_queue_ms: float = 5.0            # NIC ring/queue depth expressed in time
    run_id: str | None = None
    # More pod namespaces, built like the tenants' but no tenant of the isolation scenarios (which
    # iterate ``tenants`` only): bench/pod_caps.py's annotated pods beside the isolation tenants.
    extra_pods: tuple[TenantSpec, ...] = ()
    # Also emulate the link towards the node: the same TBF on the wire's egress to the uplink, so
    # traffic from ``recv`` to the pods (iperf3 -R) crosses a link of the same capacity.
    inbound_link: bool = False
    # How the traffic processes (iperf3 clients and servers, the UDP flood and its sink, ping) are
    # scheduled. With other load on the machine the scheduler shares a core between that load and
    # a sender, which then offers less than it wants: the figures measure the scheduler, not the
    # shaper. ``traffic_nice`` (e.g. -15) runs them at that nice value; ``sender_cpus`` pins the
    # i-th tenant's senders to ``sender_cpus[i % len]`` (servers stay unpinned). Off by default.
    traffic_nice: int | None = None
    sender_cpus: tuple[int, ...] = ()
    # iperf3 -Z: TCP senders use sendfile, so the kernel sends from the page cache without copying
    # each byte from user space first: less CPU per bit in the sender, the same traffic on the wire.
    sender_zerocopy: bool = False

    def tbf_burst(self) -> int:
        if self.tbf_burst_bytes:
            return self.tbf_burst_bytes
        one_ms = self.link_mbit * MBIT // 8 // 1000
        return max(65536 + 1514 * 2, one_ms)

    def tbf_limit(self) -> int:
        q = int(self.link_mbit * MBIT / 8 * self.tbf_queue_ms / 1000)
        return max(q, 2 * self.tbf_burst())


UPLINK_NODE = "198.18.0.1"
UPLINK_WIRE = "198.18.0.2"
UPLINK_PLEN = 30
RECV_GW = "198.18.254.1"
RECV_ADDR = "198.18.254.2"
RECV_PLEN = 24


class Bed:
    """The test bed; use as ``with Bed(BedConfig()) as bed: ...``.

    Attributes after :meth:`build`: ``ns`` (role -> netns name), ``uplink``
    (shaped interface inside ``ns['node']``), ``wire_out`` (TBF interface in
    ``ns['wire']``), ``pod_if`` (tenant short -> interface in its pod),
    ``procs`` (the :class:`ProcessRegistry`), ``workdir`` (temp files).
    """

    def __init__(self, config: BedConfig | None = None):
        self.config = config or BedConfig()
        self.run_id = self.config.run_id or secrets.token_hex(3)
        rid = self.run_id
        self.ns: dict[str, str] = {"node": f"{NS_PREFIX}{rid}-node", "wire": f"{NS_PREFIX}{rid}-wire",
                                   "recv": f"{NS_PREFIX}{rid}-recv"}
        for t in self.pods:
            self.ns[f"pod-{t.short}"] = f"{NS_PREFIX}{rid}-pod-{t.short}"
        # interface names (<= 15 chars), all carry the run id
        self.uplink = f"up-{rid}"
        self.wire_in = f"wi-{rid}"
        self.wire_out = f"wo-{rid}"
        self.recv_if = f"rx-{rid}"
        self.pod_if = {t.short: f"p{t.short}-{rid}" for t in self.pods}
        self.node_if = {t.short: f"n{t.short}-{rid}" for t in self.pods}
        self.nets = netns.Namespaces()
        self.procs = self.nets.procs
        self.workdir = f"/tmp/shaperd-bed-{rid}"
        self.recv_addr = RECV_ADDR
        self._built = False
        self._torn_down = False
        self._old_handlers: dict[int, object] = {}
        self._teardown_lock = threading.Lock()

    # ------------------------------------------------------------------ names
    @property
    def link_bps(self) -> int:
        return self.config.link_mbit * MBIT

    @property
    def pods(self) -> tuple[TenantSpec, ...]:
        """Every pod namespace: the tenants' and the extra pods."""
        return (*self.config.tenants, *self.config.extra_pods)

    def tenant(self, short_or_name: str) -> TenantSpec:
        for t in self.pods:
            if short_or_name in (t.short, t.name):
                return t
        raise KeyError(short_or_name)

    def pod_ns(self, tenant: TenantSpec | str) -> str:
        t = tenant if isinstance(tenant, TenantSpec) else self.tenant(tenant)
        return self.ns[f"pod-{t.short}"]

    def traffic_argv(self, argv: list[str], tenant: str | None = None) -> list[str]:
        """*argv* under the bed's scheduling (``nice``, ``taskset`` for a tenant's sender), as an argument list."""
        cfg = self.config
        out = list(argv)
        if tenant is not None and cfg.sender_cpus:
            idx = next(i for i, t in enumerate(self.pods) if t.short == tenant)
            out = ["taskset", "-c", str(cfg.sender_cpus[idx % len(cfg.sender_cpus)]), *out]
        if cfg.traffic_nice is not None:
            out = ["nice", "-n", str(int(cfg.traffic_nice)), *out]
        return out

    def namespaces(self) -> list[str]:
        return list(self.ns.values())

    def interfaces(self) -> list[str]:
        return [self.uplink, self.wire_in, self.wire_out, self.recv_if,
                *self.pod_if.values(), *self.node_if.values()]

    # ------------------------------------------------------------- lifecycle
    def __enter__(self) -> "Bed":
        self._install_signal_handlers()
        try:
            self.build()
        except BaseException:
            self.teardown()
            self._restore_signal_handlers()
            raise
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            self.teardown()
        finally:
            self._restore_signal_handlers()

    def build(self) -> None:
        """Create namespaces, veths, addresses, routes and the wire's TBF."""
        os.makedirs(self.workdir, exist_ok=True)
        self._built = True  # from here on teardown has something to do
        for ns in self.ns.values():
            self.nets.add(ns, ipv6=False)
        node, wire, recv = self.ns["node"], self.ns["wire"], self.ns["recv"]
        for t in self.pods:
            pod = self.pod_ns(t)
            pif, nif = self.pod_if[t.short], self.node_if[t.short]
            netns.veth(pif, pod, nif, node)
            netns.addr(pod, pif, f"{t.pod_addr}/24")
            netns.addr(node, nif, f"{t.gw_addr}/24")
            run([IP, "route", "add", "default", "via", t.gw_addr], pod)
        netns.veth(self.uplink, node, self.wire_in, wire)
        netns.addr(node, self.uplink, f"{UPLINK_NODE}/{UPLINK_PLEN}")
        netns.addr(wire, self.wire_in, f"{UPLINK_WIRE}/{UPLINK_PLEN}")
        netns.veth(self.wire_out, wire, self.recv_if, recv)
        netns.addr(wire, self.wire_out, f"{RECV_GW}/{RECV_PLEN}")
        netns.addr(recv, self.recv_if, f"{RECV_ADDR}/{RECV_PLEN}")
        run([IP, "route", "add", "default", "via", UPLINK_WIRE], node)
        for t in self.pods:
            run([IP, "route", "add", t.cidr, "via", UPLINK_NODE], wire)
        run([IP, "route", "add", "default", "via", RECV_GW], recv)
        for ns in (node, wire):
            run(["sysctl", "-qw", "net.ipv4.ip_forward=1"], ns)
        self.set_wire_rate(self.config.link_mbit)
        log.info("bed %s built", self.run_id)

    def set_wire_rate(self, mbit: int) -> None:
        """(Re)program the wire's TBF: the emulated NIC capacity."""
        cfg = self.config
        for dev in (self.wire_out, self.wire_in) if cfg.inbound_link else (self.wire_out,):
            run([TC, "qdisc", "replace", "dev", dev, "root", "handle", "1:", "tbf",
                 "rate", f"{mbit}mbit", "burst", str(cfg.tbf_burst()), "limit", str(cfg.tbf_limit())],
                self.ns["wire"])

    def teardown(self) -> None:
        """Remove everything the bed made.  Idempotent, never raises on leftovers.

        Signals (SIGINT/SIGTERM/SIGHUP) are ignored while this runs so a second
        Ctrl-C cannot interrupt cleanup halfway.
        """
        with self._teardown_lock:
            if self._torn_down or not self._built:
                self._torn_down = True
                return
            blocked = _ignore_signals()
            try:
                try:
                    self.nets.cleanup()
                finally:
                    _rmtree(self.workdir)
                self._torn_down = True
                log.info("bed %s torn down", self.run_id)
            finally:
                _restore_signals(blocked)

    def leftovers(self) -> dict[str, list]:
        """What of this bed still exists (empty lists when teardown was total)."""
        ns_left = [n for n in list_netns() if n in self.ns.values()]
        links = run([IP, "-o", "link", "show"], check=False).stdout
        if_left = [i for i in self.interfaces() if f" {i}:" in links or f" {i}@" in links]
        procs_left = [p.pid for p in self.procs.live()]
        procs_left += _pids_mentioning(self.run_id)
        return {"netns": ns_left, "interfaces": if_left, "processes": sorted(set(procs_left)),
                "workdir": [self.workdir] if os.path.exists(self.workdir) else []}

    # --------------------------------------------------------------- signals
    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return

        def handler(signum, frame):
            raise BedInterrupted(signum)

        for sig in (signal.SIGTERM, signal.SIGHUP):
            try:
                self._old_handlers[sig] = signal.signal(sig, handler)
            except (ValueError, OSError):  # pragma: no cover
                pass

    def _restore_signal_handlers(self) -> None:
        for sig, old in self._old_handlers.items():
            try:
                signal.signal(sig, old)  # type: ignore[arg-type]
            except (ValueError, OSError, TypeError):  # pragma: no cover
                pass
        self._old_handlers.clear()

    # --------------------------------------------------------------- helpers
    def exec(self, role: str, argv: list[str], **kw):
        """Run a short command in the namespace of *role* ('node', 'pod-a', ...)."""
        return run(argv, self.ns[role], **kw)

    def exec_ns(self, netns: str, argv: list[str], **kw):
        """Run a short command in one of this bed's namespaces, by netns name."""
        if netns not in self.ns.values():
            raise KeyError(netns)
        return run(argv, netns, **kw)

    def clear_node_shaping(self) -> None:
        """Remove any root qdisc from the uplink (back to the default)."""
        run([TC, "qdisc", "del", "dev", self.uplink, "root"], self.ns["node"], check=False)


def _pids_mentioning(token: str) -> list[int]:
    """Pids whose command line mentions *token* (our run id), excluding us."""
    found = []
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if token in cmdline and "pytest" not in cmdline:
            found.append(int(entry))
    return found


def _ignore_signals() -> dict[int, object]:
    old: dict[int, object] = {}
    if threading.current_thread() is not threading.main_thread():
        return old
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        try:
            old[sig] = signal.signal(sig, signal.SIG_IGN)
        except (ValueError, OSError):  # pragma: no cover
            pass
    return old


def _restore_signals(old: dict[int, object]) -> None:
    for sig, h in old.items():
        try:
            signal.signal(sig, h)  # type: ignore[arg-type]
        except (ValueError, OSError, TypeError):  # pragma: no cover
            pass


def _rmtree(path: str) -> None:
    import shutil
    shutil.rmtree(path, ignore_errors=True)


def stale_netns(prefix: str = NS_PREFIX) -> list[str]:
    """Bed namespaces left by earlier runs (e.g. after SIGKILL of the bed)."""
    return [n for n in list_netns() if n.startswith(prefix)]


def remove_stale(prefix: str = NS_PREFIX) -> list[str]:
    """Kill processes in and delete every namespace starting with *prefix*."""
    removed = []
    for ns in stale_netns(prefix):
        netns.delete_netns(ns)
        removed.append(ns)
    return removed
