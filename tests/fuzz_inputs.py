"""Bad-input generators and the one property each input must keep (issue 14): for the tenants file
loader, pod objects from the API, and the kubelet's pod-resources replies.

Owns: the hypothesis strategies (random text, random JSON/YAML documents, mutations of a good input:
truncation, byte flips, splices) and ``check_*`` functions stating the property: the input is either
accepted or refused with the boundary's typed error (ConfigError, PodParseError; for pod-resources a
protobuf DecodeError, which the gRPC client turns into PodResourcesError), within a bounded time, and
nothing else escapes. Used by tests/unit/test_fuzz_inputs.py (fixed budget) and bench/fuzz.py (longer).
Must not: touch the kernel or the network.
"""

from __future__ import annotations

import json
import time

import yaml
from hypothesis import strategies as st

from shaperd.core.config import load_text
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
