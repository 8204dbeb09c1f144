"""Per-pod bandwidth caps end to end: pods with ``kubernetes.io/egress-bandwidth`` and
``kubernetes.io/ingress-bandwidth`` annotations served by the fake API server (tests/k8s_fake.py),
the real daemon (``shaperd run --kubeconfig``) following them, and the kernel read back.

What is checked, each through a kernel reader that is not shaperd's (pyroute2 for HTB classes,
``tc -j`` for qdiscs and filters; the eBPF classifier's maps by program id):

- an egress-annotated pod gets its own HTB class (7368:<pod minor>, under its tenant's class,
  ceil = min(annotation, the tenant's limit)) and that class counts the packets the pod sends;
- a changed annotation (a MODIFIED event; the pod and its veth untouched) changes the ceil of the
  same class; a removed annotation removes the class; a deleted pod leaves no class, filter, map
  entry or qdisc behind;
- an invalid value gives one warning naming the pod and the value, and
  ``shaperd_pod_annotation_invalid_total{reason}`` at 1, also after another reconcile, while the
  other pods keep their classes;
- an ingress-annotated pod gets a cap on its host-side veth (egress towards the pod) that counts what
  it receives, follows a change, and goes when the annotation or the pod goes.

Every wait is on a condition with a deadline that only bounds a failure; no rate is asserted. The
daemon runs in its own process group, logs to a file, and is stopped by group id however the test
ends; the bed fixture removes the namespaces.
"""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import subprocess
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families
from pyroute2 import IPRoute

from shaperd.backends.common.classify import pod_minors
from shaperd.backends.common.objects import ROOT_HANDLE
from shaperd.core.ids import assign_minors
from shaperd_bed import netns
from tests import procs
from tests.k8s_fake import make_pod, write_kubeconfig

from .conftest import PY, SENDER, needs_root, run, wait_for

pytestmark = needs_root

EGRESS, INGRESS = "kubernetes.io/egress-bandwidth", "kubernetes.io/ingress-bandwidth"
TENANTS = ("tenant-a", "tenant-b")
CFG = """
node: {interfaces: [up0], capacity: 1Gbps}
tenants:
  - {name: tenant-a, bandwidthGuarantee: 400Mbps, bandwidthLimit: 800Mbps, priority: 100}
  - {name: tenant-b, bandwidthGuarantee: 200Mbps, bandwidthLimit: 400Mbps, priority: 50}
"""
LIMIT_A_BPS = 800 * 10**6
MINORS = assign_minors(list(TENANTS))
A = ROOT_HANDLE | MINORS["tenant-a"]
# The "rest" leaves a tenant with capped pods gets (htb/scopes.py's identity); pod minors never take them.
REST = assign_minors([f"{t}\0rest" for t in TENANTS], frozenset(MINORS.values()))
TAKEN = frozenset(MINORS.values()) | frozenset(REST.values())
DEADLINE = 30.0  # seconds; bounds a failure only


def pod_class(uid: str, capped: list[str]) -> int:
    """The class id the shared rules give ``uid`` among the egress-capped pods ``capped``."""
    return ROOT_HANDLE | pod_minors(capped, TAKEN)[uid]


def tc_id(classid: int) -> str:
    return f"{classid >> 16:x}:{classid & 0xFFFF:x}"


# ------------------------------------------------------------------ the node, read back


def htb_classes(ns: str, dev: str) -> dict[int, dict]:
    """HTB classes on ``dev`` through pyroute2: classid -> parent, rate/ceil (bit/s), counters."""
    out: dict[int, dict] = {}
    with IPRoute(netns=ns) as ipr:
        found = ipr.link_lookup(ifname=dev)
        if not found:
            return out
        for c in ipr.get_classes(index=found[0]):
            if c.get_attr("TCA_KIND") != "htb":
                continue
            opts = c.get_attr("TCA_OPTIONS")
            parms = opts.get_attr("TCA_HTB_PARMS")
            basic = c.get_attr("TCA_STATS2").get_attr("TCA_STATS_BASIC")
            out[c["handle"]] = {
                "parent": c["parent"],
                "rate_bps": (opts.get_attr("TCA_HTB_RATE64") or parms["rate"]) * 8,
                "ceil_bps": (opts.get_attr("TCA_HTB_CEIL64") or parms["ceil"]) * 8,
                "bytes": basic["bytes"], "packets": basic["packets"],
            }
    return out


def tc_json(ns: str, *what: str) -> list:
    return json.loads(netns.run(("tc", "-j", "-s", *what), ns, check=False).stdout or "[]")


def classifier_entries(ns: str, dev: str) -> dict[str, dict[bytes, bytes]]:
    """The entries of shaperd's eBPF map classifier on ``dev`` by map role (empty on the u32 path).

    The program is found in tc's own JSON; its maps are opened by the program's id."""
    from shaperd.backends.common import kernel_classifier

    ids = [f["options"]["prog"]["id"] for f in tc_json(ns, "filter", "show", "dev", dev, "egress")
           if f.get("options", {}).get("bpf_name", "").startswith("shpd_c") and "prog" in f["options"]]
    out: dict[str, dict[bytes, bytes]] = {}
    for prog in ids:
        with kernel_classifier.ClassifierMaps.adopt(prog) as maps:
            for role, m in maps.maps.items():
                out.setdefault(role, {}).update(m.items())
    return out


def classifier_values(ns: str, dev: str) -> set[int]:
    """Every class id an entry of the map classifier points at."""
    return {int.from_bytes(v[:4], "little") for role, entries in classifier_entries(ns, dev).items()
            if role != "cglevels" for v in entries.values()}


def classifier_knows(ns: str, dev: str, ifindex: int, ip: str) -> list[str]:
    """Entries keyed by a pod's host ifindex or its address (ifindex and src4 maps)."""
    entries = classifier_entries(ns, dev)
    found = [f"ifindex {ifindex}" for k in entries.get("ifindex", {}) if int.from_bytes(k, "little") == ifindex]
    found += [f"src4 {ip}" for k in entries.get("src4", {}) if k[4:] == socket.inet_aton(ip)]
    return found


def traces_of(ns: str, dev: str, classid: int) -> list[str]:
    """What on ``dev`` still names ``classid``: a class, a qdisc under it, a filter, a map entry."""
    cid = tc_id(classid)
    left = []
    if classid in htb_classes(ns, dev):
        left.append(f"class {cid}")
    left += [f"qdisc {q.get('kind')} {q.get('handle')}" for q in tc_json(ns, "qdisc", "show", "dev", dev)
             if q.get("parent") == cid]
    for where in ((), ("egress",), ("ingress",)):
        for f in tc_json(ns, "filter", "show", "dev", dev, *where):
            if f'"{cid}"' in json.dumps(f) or f.get("options", {}).get("classid") == cid:
                left.append(f"filter {' '.join(where) or 'root'} {json.dumps(f)[:120]}")
    if classid in classifier_values(ns, dev):
        left.append(f"map entry -> {cid}")
    return left


def veth_caps_bps(ns: str, dev: str) -> set[int]:
    """The rates shaping ``dev``'s egress (towards the pod): tbf rates and HTB ceils, in bit/s."""
    rates = {int(q["options"]["rate"]) * 8 for q in tc_json(ns, "qdisc", "show", "dev", dev)
             if q.get("kind") == "tbf" and "rate" in q.get("options", {})}
    return rates | {c["ceil_bps"] for c in htb_classes(ns, dev).values()}


def root_qdisc(ns: str, dev: str) -> dict:
    return next((q for q in tc_json(ns, "qdisc", "show", "dev", dev) if q.get("root")), {})


# ------------------------------------------------------------------ pods and the daemon


@dataclass
class Pod:
    """A routed veth pod: host side ``host_if`` in the node namespace, ``eth0`` in its own namespace."""

    name: str
    ns: str
    host_if: str
    ip: str
    api: dict

    @property
    def uid(self) -> str:
        return self.api["metadata"]["uid"]


def routed_pod(bed, i: int, name: str, tenant: str | None, annotations: dict | None = None) -> Pod:
    """A routed veth (its own /24, static neighbours, IPv6 off: no chatter in the counters) and its API object."""
    ns = bed.ns(f"{bed.tag}-p{i}")
    host_if, net = f"cap{i}", f"198.18.{40 + i}"
    run("ip", "-n", bed.node, "link", "add", host_if, "type", "veth", "peer", "name", "eth0", "netns", ns)
    for where, dev in ((bed.node, host_if), (ns, "eth0")):
        netns.run(["sysctl", "-qw", f"net.ipv6.conf.{dev}.disable_ipv6=1"], where)
    netns.addr(bed.node, host_if, f"{net}.1/24")
    netns.addr(ns, "eth0", f"{net}.2/24")
    run("ip", "-n", bed.node, "link", "set", host_if, "up")
    run("ip", "-n", ns, "link", "set", "eth0", "up")
    run("ip", "-n", ns, "route", "add", "default", "via", f"{net}.1")
    netns.neigh(bed.node, host_if, f"{net}.2", netns.link(ns, "eth0")["address"])
    netns.neigh(ns, "eth0", f"{net}.1", netns.link(bed.node, host_if)["address"])
    run("ip", "-n", bed.peer, "route", "replace", f"{net}.0/24", "via", "198.18.0.1")
    obj = make_pod(name, "node-1", ips=(f"{net}.2",), labels={"training-tenant": tenant} if tenant else {})
    if annotations:
        obj["metadata"]["annotations"] = dict(annotations)
    return Pod(name, ns, host_if, f"{net}.2", obj)


def annotate(api, pod: Pod, **values: str | None) -> None:
    """Set (a string) or remove (None) annotations, as one MODIFIED event; keys egress= and ingress=."""
    keys = {"egress": EGRESS, "ingress": INGRESS}

    def change(obj: dict) -> None:
        ann = obj["metadata"].setdefault("annotations", {})
        for k, v in values.items():
            if v is None:
                ann.pop(keys[k], None)
            else:
                ann[keys[k]] = v

    pod.api = api.modify_pod(pod.uid, change)


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Daemon:
    """The running daemon's log and metrics endpoint."""

    def __init__(self, proc: subprocess.Popen, log: Path, port: int):
        self.proc, self.log, self.port = proc, log, port

    def tail(self) -> str:
        return self.log.read_text()[-4000:]

    def records(self) -> list[dict]:
        out = []
        for line in self.log.read_text().splitlines():
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
        return out

    def metrics(self) -> dict[tuple, float]:
        try:
            text = urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=20).read().decode()
        except OSError:
            return {}
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for fam in text_string_to_metric_families(text) for s in fam.samples}

    def value(self, name: str, **labels) -> float | None:
        return self.metrics().get((name, tuple(sorted(labels.items()))))

    def ready(self) -> bool:
        try:
            return urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=20).status == 200
        except OSError:
            return False

    def reconcile_now(self) -> dict:
        """SIGHUP, then the "reconciled" record of the reconcile it caused."""
        before = len([r for r in self.records() if r.get("event") == "reconciled"])
        self.proc.send_signal(signal.SIGHUP)
        assert wait_for(lambda: len([r for r in self.records() if r.get("event") == "reconciled"]) > before,
                        DEADLINE), self.tail()
        return [r for r in self.records() if r.get("event") == "reconciled"][-1]


@contextlib.contextmanager
def daemon(bed, tmp_path: Path, api):
    """``shaperd run --kubeconfig`` in the host namespace (to reach the fake on loopback), acting in the node's."""
    cfg = tmp_path / "t.yaml"
    cfg.write_text(CFG)
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api.url)
    port = _free_port()
    log = tmp_path / "daemon.log"
    with open(log, "w") as logf, procs.running(
        [PY, "-m", "shaperd", "--log-json", "run", "--config", str(cfg), "--netns", bed.node,
         "--node-name", "node-1", "--kubeconfig", str(kubeconfig), "--resync-interval", "30",
         "--metrics-address", f"127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=logf,
    ) as proc:
        d = Daemon(proc, log, port)
        assert wait_for(d.ready, DEADLINE), f"daemon never became ready: {d.tail()}"
        yield d
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=DEADLINE) == 0, d.tail()


def sends_into(bed, pod: Pod, classid: int, n: int = 10) -> bool:
    """``n`` datagrams from the pod to the peer beyond the uplink: all of them counted in ``classid``."""
    before = htb_classes(bed.node, "up0").get(classid, {"packets": 0})["packets"]
    procs.run(["ip", "netns", "exec", pod.ns, PY, "-c", SENDER, "-", "198.18.0.2", "200", str(n)])
    return htb_classes(bed.node, "up0").get(classid, {"packets": -10**9})["packets"] - before == n


def ceil_of(bed, classid: int) -> int | None:
    c = htb_classes(bed.node, "up0").get(classid)
    return c["ceil_bps"] if c else None


# ------------------------------------------------------------------ the tests


def test_egress_cap_followed_live_through_the_api(bed, tmp_path, api):
    bed.exec("sysctl", "-qw", "net.ipv4.ip_forward=1")
    capped = routed_pod(bed, 0, "capped-0", "tenant-a", {EGRESS: "100M"})
    other = routed_pod(bed, 1, "other-0", "tenant-a")
    loner = routed_pod(bed, 2, "loner-0", None, {EGRESS: "100M"})  # a pod of no tenant: capped all the same
    with daemon(bed, tmp_path, api) as d:
        for p in (capped, other, loner):
            api.add_pod(p.api)
        everyone = [capped.uid, loner.uid]
        cls, cls_loner = pod_class(capped.uid, everyone), pod_class(loner.uid, everyone)

        # Its own class, inside its tenant's, at the annotated ceil; it counts what the pod sends.
        assert wait_for(lambda: ceil_of(bed, cls) == 100 * 10**6, DEADLINE), \
            f"{htb_classes(bed.node, 'up0')}\n{d.tail()}"
        assert htb_classes(bed.node, "up0")[cls]["parent"] == A
        assert wait_for(lambda: sends_into(bed, capped, cls), DEADLINE), d.tail()
        assert sends_into(bed, capped, A)  # the tenant's class counts it as well: the cap nests inside
        before = htb_classes(bed.node, "up0")[cls]["packets"]
        assert sends_into(bed, other, A)  # the unannotated tenant-mate: its tenant, not the capped pod's class
        assert htb_classes(bed.node, "up0")[cls]["packets"] == before
        assert wait_for(lambda: ceil_of(bed, cls_loner) == 100 * 10**6, DEADLINE), d.tail()
        assert sends_into(bed, loner, cls_loner)
        # In sync: another reconcile writes nothing.
        assert d.reconcile_now()["changes"] == 0, d.tail()

        # Changed through the API (MODIFIED; the pod and its veth untouched): the same class, a new ceil.
        ifindex = netns.link(bed.node, capped.host_if)["ifindex"]
        annotate(api, capped, egress="200M")
        assert wait_for(lambda: ceil_of(bed, cls) == 200 * 10**6, DEADLINE), d.tail()
        assert netns.link(bed.node, capped.host_if)["ifindex"] == ifindex
        assert sends_into(bed, capped, cls)
        # Above the tenant's limit: the tenant's limit is the ceil.
        annotate(api, capped, egress="900M")
        assert wait_for(lambda: ceil_of(bed, cls) == LIMIT_A_BPS, DEADLINE), d.tail()

        # Removed: the class and everything naming it go; the pod is back in its tenant's class.
        annotate(api, capped, egress=None)
        cls_loner_alone = pod_class(loner.uid, [loner.uid])
        assert wait_for(lambda: not traces_of(bed.node, "up0", cls), DEADLINE), \
            f"{traces_of(bed.node, 'up0', cls)}\n{d.tail()}"
        assert wait_for(lambda: sends_into(bed, capped, A), DEADLINE), d.tail()
        assert ceil_of(bed, cls_loner_alone) == 100 * 10**6

        # Annotated again, then deleted: nothing of it is left on the uplink or on its veth.
        annotate(api, capped, egress="100M")
        assert wait_for(lambda: ceil_of(bed, cls) == 100 * 10**6, DEADLINE), d.tail()
        api.delete_pod(capped.uid)
        assert wait_for(lambda: not traces_of(bed.node, "up0", cls), DEADLINE), \
            f"{traces_of(bed.node, 'up0', cls)}\n{d.tail()}"
        assert wait_for(lambda: not classifier_knows(bed.node, "up0", ifindex, capped.ip), DEADLINE), \
            f"{classifier_knows(bed.node, 'up0', ifindex, capped.ip)}\n{d.tail()}"
        assert wait_for(lambda: "shpdm_" not in bed.exec("tc", "filter", "show", "dev", capped.host_if,
                                                         "ingress").stdout, DEADLINE), d.tail()
        assert root_qdisc(bed.node, capped.host_if).get("kind") in (None, "noqueue")
        assert not sends_into(bed, capped, A)  # unknown now: the default class
        assert sends_into(bed, other, A)
        api.delete_pod(loner.uid)
        assert wait_for(lambda: not traces_of(bed.node, "up0", cls_loner_alone), DEADLINE), d.tail()


def test_invalid_annotation_warned_once_and_counted_others_keep_their_classes(bed, tmp_path, api):
    bed.exec("sysctl", "-qw", "net.ipv4.ip_forward=1")
    good = routed_pod(bed, 0, "good-0", "tenant-a", {EGRESS: "100M"})
    bad = routed_pod(bed, 1, "bad-0", "tenant-a", {EGRESS: "fast"})
    two = routed_pod(bed, 2, "two-0", "tenant-a", {EGRESS: "100M,200M"})
    cls = pod_class(good.uid, [good.uid])

    def warnings_about(pod: Pod, value: str) -> list[dict]:
        return [r for r in d.records() if r.get("level") == "warning"
                and pod.name in json.dumps(r) and value in json.dumps(r)]

    with daemon(bed, tmp_path, api) as d:
        api.add_pod(good.api)
        assert wait_for(lambda: ceil_of(bed, cls) == 100 * 10**6, DEADLINE), d.tail()
        api.add_pod(bad.api)
        api.add_pod(two.api)
        assert wait_for(lambda: d.value("shaperd_pod_annotation_invalid_total", reason="syntax") == 1, DEADLINE), \
            d.tail()
        assert wait_for(lambda: d.value("shaperd_pod_annotation_invalid_total", reason="multiple") == 1, DEADLINE), \
            d.tail()
        assert len(warnings_about(bad, "fast")) == 1, d.tail()
        assert len(warnings_about(two, "100M,200M")) == 1, d.tail()
        # The refused pods stay in their tenant, uncapped; the valid one keeps its class.
        assert sends_into(bed, bad, A) and sends_into(bed, two, A)
        assert ceil_of(bed, cls) == 100 * 10**6
        assert sends_into(bed, good, cls)
        # Another reconcile: no second warning, the counter stays at 1 (counted per value, not per pass).
        d.reconcile_now()
        assert d.value("shaperd_pod_annotation_invalid_total", reason="syntax") == 1
        assert len(warnings_about(bad, "fast")) == 1, d.tail()
        # Mended: the pod gets its cap.
        annotate(api, bad, egress="50M")
        cls_bad = pod_class(bad.uid, [good.uid, bad.uid])
        assert wait_for(lambda: ceil_of(bed, cls_bad) == 50 * 10**6, DEADLINE), d.tail()
        assert ceil_of(bed, pod_class(good.uid, [good.uid, bad.uid])) == 100 * 10**6


def test_ingress_cap_on_the_pod_veth_followed_live(bed, tmp_path, api):
    bed.exec("sysctl", "-qw", "net.ipv4.ip_forward=1")
    pod = routed_pod(bed, 0, "reader-0", "tenant-a", {INGRESS: "50M"})
    plain = routed_pod(bed, 1, "plain-0", "tenant-a")

    def receives(n: int = 10) -> bool:
        """``n`` datagrams from beyond the uplink to the pod: all counted by the root qdisc on its veth."""
        before = root_qdisc(bed.node, pod.host_if).get("packets", 0)
        bed.send("-", pod.ip, 200, n, ns=bed.peer)
        return root_qdisc(bed.node, pod.host_if).get("packets", 0) - before == n

    with daemon(bed, tmp_path, api) as d:
        api.add_pod(pod.api)
        api.add_pod(plain.api)
        assert wait_for(lambda: 50 * 10**6 in veth_caps_bps(bed.node, pod.host_if), DEADLINE), \
            f"{tc_json(bed.node, 'qdisc', 'show', 'dev', pod.host_if)}\n{d.tail()}"
        assert receives()
        assert root_qdisc(bed.node, plain.host_if).get("kind") in (None, "noqueue")  # unannotated: untouched
        assert d.reconcile_now()["changes"] == 0, d.tail()
        ifindex = netns.link(bed.node, pod.host_if)["ifindex"]
        annotate(api, pod, ingress="80M")
        assert wait_for(lambda: veth_caps_bps(bed.node, pod.host_if) & {80 * 10**6}
                        and 50 * 10**6 not in veth_caps_bps(bed.node, pod.host_if), DEADLINE), d.tail()
        assert netns.link(bed.node, pod.host_if)["ifindex"] == ifindex
        annotate(api, pod, ingress=None)
        assert wait_for(lambda: root_qdisc(bed.node, pod.host_if).get("kind") in (None, "noqueue"), DEADLINE), \
            f"{tc_json(bed.node, 'qdisc', 'show', 'dev', pod.host_if)}\n{d.tail()}"
        annotate(api, pod, ingress="50M")
        assert wait_for(lambda: 50 * 10**6 in veth_caps_bps(bed.node, pod.host_if), DEADLINE), d.tail()
        api.delete_pod(pod.uid)
        assert wait_for(lambda: root_qdisc(bed.node, pod.host_if).get("kind") in (None, "noqueue"), DEADLINE), \
            f"{tc_json(bed.node, 'qdisc', 'show', 'dev', pod.host_if)}\n{d.tail()}"
        assert not veth_caps_bps(bed.node, pod.host_if)
