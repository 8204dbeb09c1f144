"""Bad-input generators and the one property each input must keep (issue 14): for the tenants file
loader, pod objects from the API, the kubelet's pod-resources replies, pod bandwidth annotations and
the tenants' ``ingress`` block.

Owns: the hypothesis strategies (random text, random JSON/YAML documents, mutations of a good input:
truncation, byte flips, splices) and ``check_*`` functions stating the property: the input is either
accepted or refused with the boundary's typed error (ConfigError, PodParseError; for pod-resources a
protobuf DecodeError, which the gRPC client turns into PodResourcesError), within a bounded time, and
nothing else escapes. Annotations: no value makes a pod unreadable; each value is a cap within the
bounds or a refusal with a reason; the pod stays in its tenant; other pods keep their tenants and caps.
The ingress block: an accepted file keeps every admission rule, and the other tenants are as written. Used by tests/unit/test_fuzz_inputs.py (fixed budget) and bench/fuzz.py (longer).
Must not: touch the kernel or the network.
"""

from __future__ import annotations

import json
import time

import yaml
from hypothesis import strategies as st

from shaperd.core.config import load_text
from shaperd.core.config.model import default_reserve_bps
from shaperd.core.inventory import Inventory, Link
from shaperd.core.podcaps import ANNOTATIONS, MAX_BPS, MIN_BPS, REASONS, EGRESS_ANNOTATION
from shaperd.core.tenancy import shaped_capacity_bps, tenancy
from shaperd.discovery import pods as pods_mod
from shaperd.discovery.kubernetes import PodInfo
from shaperd.discovery.kubernetes.errors import PodParseError
from shaperd.discovery.podresources import api_pb2
from shaperd.discovery.podresources.model import from_reply
from shaperd.discovery.podresources.source import rdma_assignments
from shaperd.core.errors import ConfigError
from shaperd.core.roots import Roots
from tests.k8s_fake import make_pod

# No single input may take longer than this (a hang or a blow-up shows as a failure, not a slow run).
MAX_INPUT_S = 5.0

GOOD_TENANTS = """node:
  interfaces: [eth0, "ens*"]
  capacity: 100Gbps
  reserve: 1Gbps
tenants:
  - name: tenant-a
    bandwidthGuarantee: 40Gbps
    bandwidthLimit: 60Gbps
    priority: 100
    match: {cidrs: [198.18.1.0/24, "2001:db8:1::/64"], podLabels: {team: a}, namespaces: [team-a]}
    rdma: {devices: [mlx5_0], serviceLevel: 2, trafficClass: 106, nccl: {NCCL_IB_QPS_PER_CONNECTION: "4"}}
  - {name: tenant-b, bandwidthGuarantee: 20Gbps, priority: 50, match: {interfaces: [veth*]}}
"""

_scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True),
                     st.text(max_size=30), st.sampled_from(["40Gbps", "1 gigabit", "0bps", "-5Mbps", "1e3Gbps",
                                                            "198.18.0.0/15", "::/0", "eth0", "*", "tenants"]))
json_values = st.recursive(_scalars, lambda kids: st.one_of(
    st.lists(kids, max_size=6), st.dictionaries(st.one_of(st.text(max_size=12), st.sampled_from(
        ["name", "tenants", "node", "match", "metadata", "spec", "status", "podIPs", "ip", "uid", "labels",
         "bandwidthGuarantee", "bandwidthLimit", "priority", "cidrs", "interfaces", "capacity", "rdma"])),
        kids, max_size=6)), max_leaves=30)


def mutations(seed_text: str):
    """Truncations, byte flips and splices of a good input."""
    n = len(seed_text)
    truncated = st.integers(0, n).map(lambda i: seed_text[:i])
    flipped = st.lists(st.tuples(st.integers(0, n - 1), st.characters()), min_size=1, max_size=8).map(
        lambda edits: _apply(seed_text, edits))
    spliced = st.tuples(st.integers(0, n), st.text(max_size=40)).map(lambda t: seed_text[:t[0]] + t[1] + seed_text[t[0]:])
    return st.one_of(truncated, flipped, spliced)


def _apply(text: str, edits) -> str:
    chars = list(text)
    for i, c in edits:
        chars[i] = c
    return "".join(chars)


def _yaml_dump(v) -> str:
    try:
        return yaml.safe_dump(v)
    except (yaml.YAMLError, ValueError, OverflowError):
        return json.dumps(v, default=str)


tenants_texts = st.one_of(
    st.text(max_size=300),
    json_values.map(_yaml_dump),
    st.dictionaries(st.sampled_from(["tenants", "node"]), json_values, max_size=2).map(_yaml_dump),
    mutations(GOOD_TENANTS),
    st.sampled_from(["a: &a [1,2]\nb: [*a, *a]\n", "tenants: *nope\n", "!!python/object:os.system x\n",
                     "tenants: !!binary aGVsbG8=\n", "%YAML 9.9\n---\n", "? [a]\n: b\n", "\ufeff\x00\x01"]),
)

GOOD_POD = make_pod("p", "node-1", namespace="team-a", ips=("198.18.0.5", "2001:db8::5"), labels={"team": "a"},
                    uid="11111111-2222-4333-8444-555555555555")


def _mutate_pod(path_and_value):
    import copy

    path, value = path_and_value
    pod = copy.deepcopy(GOOD_POD)
    node = pod
    for k in path[:-1]:
        nxt = node.get(k) if isinstance(node, dict) else None
        if not isinstance(nxt, dict):
            return pod
        node = nxt
    if isinstance(node, dict):
        node[path[-1]] = value
    return pod


_pod_paths = st.sampled_from([("metadata",), ("metadata", "name"), ("metadata", "namespace"), ("metadata", "uid"),
                              ("metadata", "labels"), ("spec",), ("spec", "nodeName"), ("spec", "hostNetwork"),
                              ("status",), ("status", "podIP"), ("status", "podIPs"), ("status", "qosClass"),
                              ("status", "phase"), ("kind",)])
pod_objects = st.one_of(json_values, st.tuples(_pod_paths, json_values).map(_mutate_pod))


_ids = st.one_of(st.text(max_size=20), st.sampled_from(["0000:3b:00.2", "0000:3b:00.9", "0000:zz:00.1", " ",
                                                         "mlx5_0", "../../etc", "0000:3b:00.2\n"]))
_devices = st.builds(lambda r, ids: api_pb2.ContainerDevices(resource_name=r, device_ids=ids),
                     st.one_of(st.text(max_size=30), st.sampled_from(["nvidia.com/sriov_rdma_vf",
                                                                        "rdma/hca_shared_devices_a", "nvidia.com/gpu"])),
                     st.lists(_ids, max_size=4))
_containers = st.builds(lambda n, d: api_pb2.ContainerResources(name=n, devices=d), st.text(max_size=10),
                        st.lists(_devices, max_size=3))
_pods = st.builds(lambda n, ns, c: api_pb2.PodResources(name=n, namespace=ns, containers=c), st.text(max_size=10),
                  st.text(max_size=10), st.lists(_containers, max_size=3))
pod_resources_messages = st.builds(lambda p: api_pb2.ListPodResourcesResponse(pod_resources=p),
                                   st.lists(_pods, max_size=5))
pod_resources_bytes = st.one_of(st.binary(max_size=400),
                                pod_resources_messages.map(lambda m: m.SerializeToString()).flatmap(
                                    lambda b: st.one_of(st.just(b), st.integers(0, len(b)).map(lambda i: b[:i]))))


def _timed(fn, what):
    t = time.monotonic()
    out = fn()
    took = time.monotonic() - t
    assert took < MAX_INPUT_S, f"{what} took {took:.1f} s"
    return out


def check_tenants_text(text: str) -> str:
    """Accepted or ConfigError; returns which."""
    try:
        _timed(lambda: load_text(text, "fuzz.yaml"), "load_text")
        return "accepted"
    except ConfigError as e:
        assert e.problems and all(str(p) for p in e.problems)
        assert str(e).startswith("invalid tenants file fuzz.yaml")
        return "refused"


def check_pod_object(obj) -> str:
    try:
        p = _timed(lambda: PodInfo.from_dict(obj), "PodInfo.from_dict")
        assert isinstance(p.uid, str) and p.uid
        return "accepted"
    except PodParseError as e:
        assert str(e).startswith("parse pod ")
        return "refused"


def check_pod_resources_bytes(data: bytes, roots: Roots) -> str:
    from google.protobuf.message import DecodeError

    try:
        msg = api_pb2.ListPodResourcesResponse.FromString(data)
    except DecodeError:
        return "refused"  # inside grpc: a deserialisation failure, raised as PodResourcesError
    return check_pod_resources_message(msg, roots)


def check_pod_resources_message(msg, roots: Roots) -> str:
    pods, problems = _timed(lambda: from_reply(msg), "from_reply")
    assert all(isinstance(p, str) and p.startswith("pod-resources: ") for p in problems)
    assigned, notes = _timed(lambda: rdma_assignments(pods, roots), "rdma_assignments")
    assert all(isinstance(n, str) for n in notes)
    assert all(isinstance(v, tuple) for v in assigned.values())
    return "refused" if problems else "accepted"


# -- pod bandwidth annotations -----------------------------------------------------------------------------

ABSENT = object()  # the annotation is not there (None is a JSON null on the wire)
_SUFFIXES = ["", "n", "u", "m", "k", "K", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "e3", "E3",
             "e-3", "e+30", "E", "e", "Gbps", "mbit", "/s", "e99999999999", "e-99999999999"]
random_quantities = st.builds(lambda sign, whole, frac, suffix: sign + whole + frac + suffix,
                              st.sampled_from(["", "+", "-"]), st.text("0123456789", max_size=20),
                              st.sampled_from(["", ".", ".5", ".000001", ".9999999999999999999999999999999"]),
                              st.sampled_from(_SUFFIXES))
annotation_values = st.one_of(
    random_quantities,
    st.text(max_size=40),  # garbage
    st.integers(1, 200_000).map(lambda n: "9" * n),  # huge strings
    st.integers(1, 50_000).map(lambda n: "1" + "0" * n + "e-" + str(n - 6)),  # huge, and exactly 1 Mbit/s
    st.sampled_from(["fast", "0", "-5M", "100M,200M", "100M 200M", "1e999999999", "1E", "1Ei", "0.5k", "2P",
                     " 100M", "100M\n", "100M", "1.5G", "512Ki", "20G", "\x00", "١٠٠M"]),
    json_values,  # not strings: numbers, lists, objects, null
)
annotated_pods = st.lists(st.tuples(st.one_of(st.just(ABSENT), annotation_values),
                                    st.one_of(st.just(ABSENT), annotation_values)), min_size=1, max_size=6)

ANNOTATION_CFG = load_text("""node: {capacity: 10Gbps}
tenants:
  - {name: tenant-a, bandwidthGuarantee: 2Gbps, match: {podLabels: {team: a}}}
  - {name: tenant-b, bandwidthGuarantee: 1Gbps, match: {namespaces: [team-b]}}
""")
_LINKS = (Link("up0", 2, speed_bps=10**10),)


class _NoRoutes:
    def route_to(self, ip):
        return None


def _pod_wire(i: int, kind: str, egress=ABSENT, ingress=ABSENT) -> dict:
    ns, labels = ("team-b", {}) if i % 3 == 2 else ("team-a", {"team": "a"})
    pod = make_pod(f"{kind}-{i}", "node-1", namespace=ns, ips=(f"198.18.{1 if kind == 'f' else 0}.{i + 1}",),
                   labels=labels, uid=f"{kind}{i:07d}-0000-4000-8000-000000000000")
    ann = {}
    for key, v in zip(ANNOTATIONS, (egress, ingress)):
        if v is not ABSENT:
            ann[key] = v
    if ann:
        pod["metadata"]["annotations"] = ann
    return pod


# Pods that are not fuzzed: their tenants and caps must not move whatever the others carry.
STEADY = [_pod_wire(0, "s", egress="100M"), _pod_wire(1, "s", ingress="50M"),
          _pod_wire(2, "s", egress="1G", ingress="2G"), _pod_wire(3, "s")]


def _tenancy(wires):
    infos = [PodInfo.from_dict(w) for w in wires]
    inv = Inventory(links=_LINKS, pods=pods_mod.resolve(_NoRoutes(), infos, _LINKS, None))
    return tenancy(ANNOTATION_CFG, inv)


def check_annotated_pods(pairs) -> str:
    """Random egress/ingress values on pods beside steady ones: "accepted" if any value became a cap."""
    fuzzed = [_pod_wire(i, "f", e, g) for i, (e, g) in enumerate(pairs)]
    bare = [_pod_wire(i, "f") for i in range(len(pairs))]
    base = _timed(lambda: _tenancy(STEADY + bare), "tenancy")
    t = _timed(lambda: _tenancy(STEADY + fuzzed), "tenancy")
    assert t.pod_tenants == base.pod_tenants  # no annotation moves a pod, its own or another
    steady = {w["metadata"]["uid"] for w in STEADY}
    assert {u: c for u, c in t.pod_caps.items() if u in steady} == {u: c for u, c in base.pod_caps.items() if u in steady}
    link = shaped_capacity_bps(ANNOTATION_CFG, list(_LINKS))
    refused = {(a.uid, a.key): a for a in t.invalid_annotations}
    assert len(refused) == len(t.invalid_annotations)  # one refusal per pod and key
    accepted = 0
    for w, (e, g) in zip(fuzzed, pairs):
        uid = w["metadata"]["uid"]
        cap = t.pod_caps.get(uid)
        for key, v, got in ((ANNOTATIONS[0], e, cap and cap.egress_bps), (ANNOTATIONS[1], g, cap and cap.ingress_bps)):
            if v is ABSENT:
                assert got is None and (uid, key) not in refused
            elif got is not None:
                assert (uid, key) not in refused and MIN_BPS <= got <= min(MAX_BPS, link)
                accepted += 1
            else:
                a = refused[(uid, key)]
                assert a.reason in REASONS and a.message and a.warning().startswith(f"pod {a.ref}: annotation {key}=")
                assert len(a.warning()) < 1000  # a huge value is quoted, not copied
    assert not any(a.uid in steady for a in t.invalid_annotations)
    if not any(c.egress_bps for u, c in t.pod_caps.items() if u not in steady):
        assert t.pod_marks == base.pod_marks  # refusals take no mark value from anyone
    return "accepted" if accepted else "refused"


# -- the ingress block --------------------------------------------------------------------------------------

_rates = st.one_of(st.sampled_from(["150Mbps", "1Gbps", "10Gbps", "20Gbps", "0bps", "150mbps", "5GB/s", "1.5Gbps",
                                    "9999Tbps", "-1Mbps", "100 Mbps"]), _scalars)
_plausible_rates = st.sampled_from(["100Mbps", "150Mbps", "1Gbps", "4Gbps", "6Gbps", "9.9Gbps", "10Gbps", "11Gbps",
                                    "500mbit", "1GB/s", "2GB/s"])
_plausible = st.fixed_dictionaries({}, optional={"bandwidthGuarantee": _plausible_rates,
                                                 "bandwidthLimit": _plausible_rates})
ingress_blocks = st.one_of(
    st.just(ABSENT), _plausible, _plausible, _plausible,
    json_values,
    st.dictionaries(st.sampled_from(["bandwidthGuarantee", "bandwidthLimit", "bandwidthlimit", "limit", "burst"]),
                    _rates, max_size=3),
)


def _ingress_doc(blocks) -> str:
    tenants = [{"name": "tenant-a", "bandwidthGuarantee": "4Gbps"},
               {"name": "tenant-b", "bandwidthGuarantee": "2Gbps", "bandwidthLimit": "8Gbps"}]
    for t, b in zip(tenants, blocks):
        if b is not ABSENT:
            t["ingress"] = b
    return _yaml_dump({"node": {"capacity": "10Gbps"},
                       "tenants": tenants + [{"name": "tenant-c", "bandwidthGuarantee": "1Gbps"}]})


ingress_texts = st.tuples(ingress_blocks, ingress_blocks).map(_ingress_doc)


def check_ingress_text(text: str) -> str:
    """Accepted (and then every admission rule holds, the tenants without a block are as written) or ConfigError."""
    try:
        cfg = _timed(lambda: load_text(text, "fuzz.yaml"), "load_text")
    except ConfigError as e:
        assert e.problems and all(str(p) for p in e.problems)
        return "refused"
    cap = cfg.node.capacity_bps
    total = 0
    for t in cfg.tenants:
        if t.ingress is None:
            continue
        g, l = t.ingress.guarantee_bps, t.ingress.limit_bps
        assert g is not None or l is not None
        assert g is None or l is None or g <= l
        assert l is None or l <= cap
        total += g or 0
    assert total == 0 or total + default_reserve_bps(cap) <= cap
    c = cfg.tenant("tenant-c")
    assert (c.guarantee_bps, c.limit_bps, c.ingress) == (10**9, None, None)
    return "accepted"
