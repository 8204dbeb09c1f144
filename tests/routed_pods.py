"""Routed-veth pods for the pod churn test and the pod benchmarks (bench/pod_churn.py, pod_latency.py).

Owns: a pod's API object and its routed veth (host side ``c<kind><i>`` in the
node namespace, with /32 and /128 routes, as Calico makes them), and reading
back what shaperd put on the node through our own pyroute2 socket, decoded
here and not by shaperd's reader, so a check does not trust what it checks:
mark programs, u32 filters on the uplink, the map classifier's entries, and a
normalised snapshot of every qdisc, class, filter and map entry that is
comparable across a teardown and a fresh apply. A pod may carry
``kubernetes.io/egress-bandwidth`` (``egress``): it is then enforced when its
addresses map to a class of its own with its cap as ceil, under its tenant's
class; ``leftovers`` names whatever of deleted pods is still on the node.

Must not: assert or time anything (the test asserts, the benchmarks time).
Namespaces and commands go through ``shaperd_bed.netns``.
"""

from __future__ import annotations

import collections
import ipaddress
import os
import socket
import struct
from dataclasses import dataclass

from shaperd_bed import netns

NODE_NAME = "node-1"
CFG = """
node: {interfaces: [up0], capacity: 10Gbps}
tenants:
  - {name: tenant-a, bandwidthGuarantee: 4Gbps, bandwidthLimit: 6Gbps, priority: 100}
  - {name: tenant-b, bandwidthGuarantee: 2Gbps, bandwidthLimit: 4Gbps, priority: 50, match: {namespaces: [team-b]}}
"""
HTB_ROOT = 0x73680000
HTB_ROOT_CLASS = HTB_ROOT | 1
EGRESS_ANNOTATION = "kubernetes.io/egress-bandwidth"
INGRESS, EGRESS = 0xFFFFFFF2, 0xFFFFFFF3
PRIO_MARK = 0x7368


@dataclass
class PodSpec:
    """One pod: its API object and its routed veth (host side ``host_if`` in the node namespace)."""

    kind: str  # "s" steady/background, "c" churn, "t" latency trial
    idx: int
    tenant: str | None
    uid: str = ""
    ip4: str = ""
    ip6: str = ""
    egress: str | None = None  # kubernetes.io/egress-bandwidth, or not annotated

    def __post_init__(self):
        self.uid = self.uid or f"{self.kind}{self.idx:06d}-0000-4000-8000-{os.getpid():012d}"
        if not self.ip4:
            # steady/trial pods: 198.19.0.1.. ; churn pods reuse a pool of 200 addresses (as clusters do)
            n = self.idx % 200 if self.kind == "c" else self.idx
            base = {"s": 0, "t": 150, "c": 250}[self.kind] * 200 + n
            self.ip4 = f"198.19.{base // 200}.{base % 200 + 1}"
            self.ip6 = f"2001:db8:19:{ {'s': 0, 't': 1, 'c': 2}[self.kind] }::{n + 1:x}"

    @property
    def name(self) -> str:
        return f"{ {'s': 'steady', 't': 'trial', 'c': 'churn'}[self.kind] }-{self.idx}"

    @property
    def host_if(self) -> str:
        return f"c{self.kind}{self.idx}"

    @property
    def peer_if(self) -> str:
        return f"p{self.kind}{self.idx}"

    @property
    def namespace(self) -> str:
        return "team-b" if self.tenant == "tenant-b" else "team-a"

    @property
    def labels(self) -> dict:
        return {"training-tenant": "tenant-a"} if self.tenant == "tenant-a" else {"app": "x"}

    @property
    def ips(self) -> tuple[str, str]:
        return (self.ip4, self.ip6)

    def api_object(self) -> dict:
        from tests.k8s_fake import make_pod

        obj = make_pod(self.name, NODE_NAME, namespace=self.namespace, ips=self.ips, labels=self.labels,
                       uid=self.uid)
        if self.egress is not None:
            obj["metadata"]["annotations"] = {EGRESS_ANNOTATION: self.egress}
        return obj

    @property
    def cap_bps(self) -> int | None:
        from shaperd.core.podcaps import parse_bandwidth

        return parse_bandwidth(self.egress) if self.egress is not None else None

    def info(self):
        from shaperd.discovery.kubernetes import PodInfo

        return PodInfo.from_dict(self.api_object())


def annotation_plan(c: int) -> tuple[str | None, str | None]:
    """Churn pod ``c``'s kubernetes.io/egress-bandwidth when it is created and after it changes while it lives:
    a third are created capped (every sixth of them changes value, the others lose the cap), and every fourth
    of the rest gains one."""
    if c % 3 == 0:
        return "50M", ("80M" if c % 6 == 0 else None)
    if c % 4 == 1:
        return None, "120M"
    return None, None


def steady_annotation(i: int, before_half: bool) -> str | None:
    """Steady pod ``i``'s annotation in the first and the second half of a churn: every third capped at
    first; at half-time the first of those changes value, the second loses it, and pod 1 gains one."""
    if before_half:
        return "200M" if i % 3 == 0 else None
    return {0: "300M", 1: "150M", 3: None}.get(i, "200M" if i % 3 == 0 else None)


def tenant_for(i: int) -> str | None:
    """Steady pods: every fifth in no tenant, the others alternating tenant-a / tenant-b."""
    if i % 5 == 4:
        return None
    return "tenant-a" if i % 2 == 0 else "tenant-b"


def build_node(nets: netns.Namespaces, tag: str) -> tuple[str, str, str]:
    """The benchmarks' node: namespaces ``<tag>-node`` (uplink ``up0``, forwarding on), ``<tag>-peer``
    (``up1``) and ``<tag>-pods`` (the pod ends of the veths), made in *nets* (which removes them)."""
    node, peer, pods = (nets.add(f"{tag}-{role}") for role in ("node", "peer", "pods"))
    netns.run(["sysctl", "-qw", "net.ipv4.ip_forward=1"], node)
    netns.veth("up0", node, "up1", peer)
    netns.addr(node, "up0", "198.18.0.1/24", "2001:db8:1::1/64")
    netns.addr(peer, "up1", "198.18.0.2/24")
    netns.run(["ip", "-n", node, "route", "add", "default", "via", "198.18.0.2"])
    return node, peer, pods


def add_routed_pods(node_ns: str, pods_ns: str, pods: list[PodSpec]) -> None:
    """Routed veths for ``pods`` as Calico makes them: host side in ``node_ns`` with a /32 and a /128
    route to the pod's addresses, pod side (up, no addresses: no traffic is sent) in ``pods_ns``.
    Two ip(8) batches whatever their number."""
    lines = []
    for p in pods:
        lines += [f"link add {p.host_if} type veth peer name {p.peer_if} netns {pods_ns}",
                  f"link set {p.host_if} up",
                  f"route add {p.ip4}/32 dev {p.host_if} scope link",
                  f"route add {p.ip6}/128 dev {p.host_if}"]
    netns.batch(node_ns, lines)
    netns.batch(pods_ns, (f"link set {p.peer_if} up" for p in pods))


def remove_routed_pod(node_ns: str, pod: PodSpec) -> None:
    """The CNI's DEL: the veth goes (its peer and routes with it)."""
    netns.run(["ip", "-n", node_ns, "link", "del", pod.host_if])


class Kernel:
    """Our own rtnetlink socket in the node namespace: polls and snapshots (one socket only:
    two pyroute2 sockets open at once in one thread can hang pyroute2 0.9's event loop)."""

    def __init__(self, node_ns: str):
        from shaperd.kernel import tc

        self.netns = node_ns
        self.ipr = tc.open_writer(node_ns)
        self._idx: dict[str, int] = {}
        self._readers: list = []

    def close(self) -> None:
        for r in self._readers:
            r.close()
        self.ipr.close()

    def __enter__(self) -> "Kernel":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def reconciler(self, caps, pods_source):
        """A new Reconciler acting in the node namespace (writes on our pyroute2 socket, reads on a new
        raw reader in the same namespace)."""
        from shaperd.engine.reconciler import Reconciler, default_backends
        from shaperd.kernel.rtnl import RtnlReader

        reader = RtnlReader(self.netns)
        self._readers.append(reader)
        return Reconciler(reader, default_backends(self.ipr), caps, pods_source=pods_source)

    def ifindex(self, name: str) -> int | None:
        if name not in self._idx:
            found = self.ipr.link_lookup(ifname=name)
            if not found:
                return None
            self._idx[name] = found[0]
        return self._idx[name]

    def forget(self, name: str) -> None:
        self._idx.pop(name, None)

    def mark_name(self, ifindex: int | None) -> str | None:
        """shaperd's mark program on ``ifindex``'s clsact ingress, or None."""
        from pyroute2.netlink.exceptions import NetlinkError

        if ifindex is None:
            return None
        try:
            filters = list(self.ipr.get_filters(index=ifindex, parent=INGRESS))
        except NetlinkError:
            return None  # no clsact qdisc yet, or the interface is gone
        for f in filters:
            d = decode_filter(f)
            if d["kind"] == "bpf" and d.get("name", "").startswith("shpdm_") and d["prio"] == PRIO_MARK:
                return d["name"]
        return None

    def u32_on_uplink(self) -> set[tuple]:
        """(keys, classid) of every u32 node on up0's root."""
        from pyroute2.netlink.exceptions import NetlinkError

        try:
            filters = list(self.ipr.get_filters(index=self.ifindex("up0"), parent=HTB_ROOT))
        except NetlinkError:
            return set()
        return {(d["keys"], d["classid"]) for d in map(decode_filter, filters) if "keys" in d}

    def classifier_entries(self) -> dict[str, dict[bytes, bytes]]:
        """Every map of the eBPF map classifier on up0 by role ({} on the u32 path). The program id comes
        from tc's own JSON dump, the entries from the maps by id."""
        import json as _json

        from shaperd.backends.common import kernel_classifier as bpf_classify
        from shaperd_bed import netns as bed_netns

        out = bed_netns.run(("tc", "-j", "filter", "show", "dev", "up0", "egress"), self.netns, check=False).stdout
        ids = [f["options"]["prog"]["id"] for f in _json.loads(out or "[]")
               if f.get("options", {}).get("bpf_name", "").startswith("shpd_c") and "prog" in f["options"]]
        if not ids:
            return {}
        with bpf_classify.ClassifierMaps.adopt(ids[0]) as maps:
            return {role: m.items() for role, m in maps.maps.items()}

    def src_in_classifier(self) -> set[tuple]:
        """(keys, classid) for every source prefix in the eBPF map classifier on up0 (empty on the u32 path)."""
        from shaperd.backends.common.objects import src_prefix_keys

        maps = self.classifier_entries()
        entries = {**maps.get("src4", {}), **maps.get("src6", {})}
        got = set()
        for key, val in entries.items():
            plen = int.from_bytes(key[:4], "little")
            net = ipaddress.ip_network((ipaddress.ip_address(key[4:]), plen))
            keys = tuple(sorted(((k.value, k.mask, k.offset) for k in src_prefix_keys(net)), key=lambda k: k[2]))
            got.add((keys, int.from_bytes(val, "little")))
        return got

    def state(self) -> dict[str, list]:
        """Normalised kernel state of the node: comparable across a teardown and a fresh apply.

        Decoded here with pyroute2 (not shaperd's reader), so the check does not trust what it checks."""
        from pyroute2.netlink.exceptions import NetlinkError

        names = {l["index"]: l.get_attr("IFLA_IFNAME") for l in self.ipr.get_links()}
        qdiscs, classes, filters = [], [], []
        parents: dict[int, set[int]] = collections.defaultdict(set)
        for q in self.ipr.get_qdiscs():
            kind, dev = q.get_attr("TCA_KIND"), names.get(q["index"], str(q["index"]))
            h = q["handle"]
            handle = "auto" if 0x8000 <= (h >> 16) < 0xFFFF else f"{h:x}"  # kernel-numbered (mq children)
            opts = q.get_attr("TCA_OPTIONS")
            extra: tuple = ()
            if kind == "htb":
                init = opts.get_attr("TCA_HTB_INIT") if opts is not None else None
                extra = ("defcls", init["defcls"] if init else None)
                parents[q["index"]].add(h)
            elif kind in ("bfifo", "pfifo"):
                extra = ("limit", int(opts.get("limit", 0)) if opts is not None else None)
            elif kind == "fq_codel":
                extra = ("limit", opts.get_attr("TCA_FQ_CODEL_LIMIT") if opts is not None else None)
            elif kind == "clsact":
                parents[q["index"]].update((INGRESS, EGRESS))
            qdiscs.append((dev, f"{q['parent']:x}", handle, kind, extra))
        htb_devs = sorted({q["index"] for q in self.ipr.get_qdiscs() if q.get_attr("TCA_KIND") == "htb"})
        for c in (c for idx in htb_devs for c in self.ipr.get_classes(index=idx)):
            if c.get_attr("TCA_KIND") != "htb":
                continue
            opts = c.get_attr("TCA_OPTIONS")
            parms = opts.get_attr("TCA_HTB_PARMS") if opts is not None else None
            if parms is None:
                continue
            rate = opts.get_attr("TCA_HTB_RATE64") or parms["rate"]
            ceil = opts.get_attr("TCA_HTB_CEIL64") or parms["ceil"]
            classes.append((names.get(c["index"]), f"{c['handle']:x}", f"{c['parent']:x}", rate, ceil,
                            parms["buffer"], parms["cbuffer"], parms["quantum"], parms["prio"]))
        for idx, ps in sorted(parents.items()):
            for parent in sorted(ps):
                try:
                    dump = list(self.ipr.get_filters(index=idx, parent=parent))
                except NetlinkError:
                    continue
                for f in dump:
                    d = decode_filter(f)
                    base = (names.get(idx), f"{parent:x}", d["prio"], f"{d['protocol']:04x}", d["kind"])
                    if d["node"] == "node" and d["kind"] == "u32":
                        filters.append(base + ("node", d["keys"], f"{d['classid']:x}", d.get("mark")))
                    elif d["node"] == "node" and d["kind"] == "bpf":
                        filters.append(base + (f"{d['handle']:x}", d["name"], f"{d['classid']:x}", d["flags"]))
                    elif d["node"] == "node":
                        filters.append(base + (f"{d['handle']:x}",))
                    else:  # the bare chain (tcf_proto) or a u32 hash table: kept, so a leftover empty one shows
                        filters.append(base + (d["node"], d.get("divisor")))
        entries = [(role, k.hex(), v.hex()) for role, m in self.classifier_entries().items() for k, v in m.items()]
        return {"qdiscs": sorted(qdiscs, key=repr), "classes": sorted(classes, key=repr),
                "filters": sorted(filters, key=repr), "maps": sorted(entries)}

    def htb_classes(self) -> dict[int, tuple[int, int]]:
        """classid -> (parent, ceil in bytes/s) of every HTB class on up0."""
        out = {}
        for c in self.ipr.get_classes(index=self.ifindex("up0")):
            opts = c.get_attr("TCA_OPTIONS")
            parms = opts.get_attr("TCA_HTB_PARMS") if opts is not None else None
            if c.get_attr("TCA_KIND") == "htb" and parms is not None:
                out[c["handle"]] = (c["parent"], opts.get_attr("TCA_HTB_CEIL64") or parms["ceil"])
        return out


def decode_filter(f) -> dict:
    """The fields of one filter message the comparison needs (u32 selector decoded from raw bytes:
    pyroute2 0.9 misaligns its keys)."""
    kind = f.get_attr("TCA_KIND")
    info = f["info"]
    d = {"kind": kind, "prio": info >> 16, "protocol": socket.ntohs(info & 0xFFFF), "handle": f["handle"]}
    opts = f.get_attr("TCA_OPTIONS")
    if f["handle"] == 0 or opts is None:
        d["node"] = "chain"
        return d
    if kind == "u32":
        if f["handle"] & 0xFFF == 0:
            d["node"] = "hashtable"
            d["divisor"] = opts.get_attr("TCA_U32_DIVISOR")
            return d
        d["node"] = "node"
        d["classid"] = opts.get_attr("TCA_U32_CLASSID") or 0
        mark = opts.get_attr("TCA_U32_MARK")
        d["mark"] = (mark["val"], mark["mask"]) if mark else None
        sel = opts.get_attr("TCA_U32_SEL")
        keys = []
        if sel is not None:
            raw = bytes(sel.data[sel.offset + 4: sel.offset + sel.length])
            for i in range(raw[2]):
                chunk = raw[16 + 16 * i: 32 + 16 * i]
                mask, val = struct.unpack("!II", chunk[:8])
                off, _offmask = struct.unpack("=ii", chunk[8:])
                keys.append((val, mask, off))
        d["keys"] = tuple(sorted(keys, key=lambda k: k[2]))
        return d
    d["node"] = "node"
    if kind == "bpf":
        d["name"] = opts.get_attr("TCA_BPF_NAME") or ""
        d["classid"] = opts.get_attr("TCA_BPF_CLASSID") or 0
        d["flags"] = opts.get_attr("TCA_BPF_FLAGS")
    return d


def state_diff(a: dict, b: dict) -> dict:
    """Multiset difference per section: what only ``a`` has and what only ``b`` has."""
    out = {}
    for k in a:
        ca, cb = collections.Counter(map(repr, a[k])), collections.Counter(map(repr, b[k]))
        only_a, only_b = sorted((ca - cb).elements()), sorted((cb - ca).elements())
        if only_a or only_b:
            out[k] = {"only_first": only_a, "only_second": only_b}
    return out


def state_counts(s: dict) -> dict:
    return {k: len(v) for k, v in s.items()}


def _keys(ip: str) -> tuple:
    from shaperd.backends.common.objects import src_prefix_keys

    return tuple(sorted(((k.value, k.mask, k.offset) for k in src_prefix_keys(ipaddress.ip_network(ip))),
                        key=lambda k: k[2]))


def tenant_classid(tenant: str) -> int:
    from shaperd.core.ids import assign_minors

    return HTB_ROOT | assign_minors(["tenant-a", "tenant-b"])[tenant]


def expected_u32(pod: PodSpec) -> set[tuple]:
    """(keys, classid) of an uncapped tenant pod's addresses: its tenant's class."""
    cid = tenant_classid(pod.tenant)
    return {(_keys(ip), cid) for ip in pod.ips}


def classids_of(k: Kernel, pod: PodSpec, entries: set[tuple] | None = None) -> dict[str, set[int]]:
    """ip -> the classes its source entries (u32 on up0's root, the map classifier) send it to."""
    entries = entries if entries is not None else (k.u32_on_uplink() | k.src_in_classifier())
    return {ip: {cid for keys, cid in entries if keys == _keys(ip)} for ip in pod.ips}


def own_class(k: Kernel, pod: PodSpec) -> int | None:
    """The class of its own a capped pod's addresses all map to (its cap as ceil, under its tenant's class,
    or beside the default class without a tenant); None while it has none."""
    got = classids_of(k, pod)
    cids = set().union(*got.values())
    if len(cids) != 1 or not all(got.values()):
        return None
    (cid,) = cids
    cls = k.htb_classes().get(cid)
    parent = tenant_classid(pod.tenant) if pod.tenant else HTB_ROOT_CLASS
    if cls is None or cls != (parent, pod.cap_bps // 8) or (pod.tenant and cid == parent):
        return None
    return cid


def enforced(k: Kernel, pod: PodSpec) -> bool:
    if k.mark_name(k.ifindex(pod.host_if)) is None:
        return False
    if pod.egress is not None:
        return own_class(k, pod) is not None
    return expected_u32(pod) <= (k.u32_on_uplink() | k.src_in_classifier())


def gone(k: Kernel, pod: PodSpec, veth_present: bool) -> bool:
    if veth_present and k.mark_name(k.ifindex(pod.host_if)) is not None:
        return False
    return not any(classids_of(k, pod).values())


def leftovers(k: Kernel, deleted: dict[int, str], deleted_pods: list[PodSpec], live_classes: set[int]) -> list[str]:
    """What of deleted pods is still on the node: an HTB class (``deleted``: classid -> pod name, the classes
    capped pods had), a u32 filter or map entry pointing at one, a source entry for one of their addresses,
    a mark program on a host interface of theirs still there. ``live_classes``: classes live pods hold (a
    deleted pod's id may be taken by a later pod). Empty when nothing is left."""
    out = []
    stale = {cid: name for cid, name in deleted.items() if cid not in live_classes}
    classes = k.htb_classes()
    out += [f"class {cid >> 16:x}:{cid & 0xFFFF:x} of deleted pod {name}" for cid, name in sorted(stale.items())
            if cid in classes]
    u32 = k.u32_on_uplink()
    out += [f"u32 filter on up0 -> {cid >> 16:x}:{cid & 0xFFFF:x} (deleted pod {stale[cid]})"
            for _keys_, cid in sorted(u32) if cid in stale]
    for role, entries in sorted(k.classifier_entries().items()):
        for key, val in sorted(entries.items()):
            cid = int.from_bytes(val, "little")
            if role != "cglevels" and cid in stale:
                out.append(f"map {role} entry {key.hex()} -> {cid >> 16:x}:{cid & 0xFFFF:x} (deleted pod {stale[cid]})")
    src = u32 | k.src_in_classifier()
    for pod in deleted_pods:
        for ip, cids in classids_of(k, pod, src).items():
            if cids:
                out.append(f"source entry {ip} of deleted pod {pod.name} -> {sorted(cids)}")
        idx = k.ifindex(pod.host_if)
        if idx is not None and k.mark_name(idx) is not None:
            out.append(f"mark program on {pod.host_if} of deleted pod {pod.name}")
    return out
