"""PodInfo parsing from wire dicts; backoff bounds; the status-code mapping."""

from __future__ import annotations

import random

import pytest
from shaperd.discovery.kubernetes import (
    Backoff,
    KubernetesError,
    PodInfo,
    PodParseError,
    ResourceExpired,
    TransientKubernetesError,
    map_api_error,
)
from shaperd.core.errors import DiscoveryError


def wire(**over) -> dict:
    pod = {
        "metadata": {"uid": "u1", "namespace": "team-a", "name": "train-0", "labels": {"tenant": "blue"},
                     "resourceVersion": "5"},
        "spec": {"nodeName": "n1", "containers": []},
        "status": {"phase": "Running", "qosClass": "Burstable", "podIP": "10.1.0.5",
                   "podIPs": [{"ip": "10.1.0.5"}, {"ip": "fd00:0:0::5"}]},
    }
    for path, value in over.items():
        *parents, leaf = path.split("__")
        d = pod
        for p in parents:
            d = d[p]
        if value is KeyError:
            d.pop(leaf, None)
        else:
            d[leaf] = value
    return pod


def test_from_dict_full():
    p = PodInfo.from_dict(wire())
    assert p == PodInfo(uid="u1", namespace="team-a", name="train-0", labels={"tenant": "blue"},
                        ips=("10.1.0.5", "fd00::5"), host_network=False, qos_class="Burstable",
                        phase="Running", node="n1")
    assert p.key == "team-a/train-0"


def test_labels_are_immutable_and_pods_hashable():
    p = PodInfo.from_dict(wire())
    with pytest.raises(TypeError):
        p.labels["tenant"] = "red"  # type: ignore[index]
    assert hash(p) == hash(PodInfo.from_dict(wire()))
    assert p != PodInfo.from_dict(wire(metadata__labels={"tenant": "red"}))


def test_ip_fallbacks_and_defaults():
    assert PodInfo.from_dict(wire(status__podIPs=KeyError)).ips == ("10.1.0.5",)
    pending = PodInfo.from_dict(wire(status={"phase": "Pending"}))
    assert pending.ips == () and pending.qos_class is None and pending.phase == "Pending"
    bare = PodInfo.from_dict({"metadata": {"uid": "u", "namespace": "n", "name": "x"}})
    assert bare.labels == {} and bare.phase == "Unknown" and bare.node == "" and not bare.host_network
    assert PodInfo.from_dict(wire(metadata__labels=None)).labels == {}
    assert PodInfo.from_dict(wire(spec__hostNetwork=True)).host_network is True


def test_status_ignored_fields_do_not_change_equality():
    a = PodInfo.from_dict(wire())
    b = PodInfo.from_dict(wire(status__conditions=[{"type": "Ready"}], metadata__resourceVersion="9",
                               metadata__annotations={"x": "y"}))
    assert a == b


EGRESS, INGRESS = "kubernetes.io/egress-bandwidth", "kubernetes.io/ingress-bandwidth"


def test_a_changed_bandwidth_annotation_is_a_change_an_unrelated_one_is_not():
    """PodInfo equality decides whether a MODIFIED event wakes the reconcile (watcher._apply)."""
    base = PodInfo.from_dict(wire(metadata__annotations={EGRESS: "100M", "x": "1"}))
    assert base.annotations == {EGRESS: "100M"}  # only the kept ones
    assert base == PodInfo.from_dict(wire(metadata__annotations={EGRESS: "100M", "x": "2", "y": "3"}))
    assert base != PodInfo.from_dict(wire(metadata__annotations={EGRESS: "200M", "x": "1"}))
    assert base != PodInfo.from_dict(wire(metadata__annotations={"x": "1"}))  # removed: the cap goes
    assert base != PodInfo.from_dict(wire(metadata__annotations={EGRESS: "100M", INGRESS: "50M"}))
    assert hash(base) == hash(PodInfo.from_dict(wire(metadata__annotations={EGRESS: "100M"})))


@pytest.mark.parametrize("value, text", [(100000000, "100000000"), (1.5e8, "150000000.0"), (True, "true"),
                                         (None, "null"), (["100M"], '["100M"]'), ({"rate": "1G"}, '{"rate": "1G"}')])
def test_a_non_string_bandwidth_value_is_kept_as_its_json_text_not_dropped(value, text):
    from shaperd.core.podcaps import NotAString, parse_bandwidth, AnnotationError

    p = PodInfo.from_dict(wire(metadata__annotations={EGRESS: value, "other": 5}))
    kept = p.annotations[EGRESS]
    assert isinstance(kept, NotAString) and str.__str__(kept) == text and "other" not in p.annotations
    with pytest.raises(AnnotationError) as ei:
        parse_bandwidth(kept, 10**9)
    assert ei.value.reason == "syntax"
    # the JSON number 100000000 and the string "100000000" are different pods' worth of change
    assert p != PodInfo.from_dict(wire(metadata__annotations={EGRESS: text}))


@pytest.mark.parametrize("over, path", [
    ({"metadata": "x"}, "metadata"),
    ({"metadata__uid": KeyError}, "metadata.uid"),
    ({"metadata__name": 5}, "metadata.name"),
    ({"metadata__labels": ["a"]}, "metadata.labels"),
    ({"metadata__labels": {"tenant": 1}}, "metadata.labels.tenant"),
    ({"spec": []}, "spec"),
    ({"spec__hostNetwork": "yes"}, "spec.hostNetwork"),
    ({"status__podIPs": "10.0.0.1"}, "status.podIPs"),
    ({"status__podIPs": [{"ip": "10.0.0.300"}]}, "status.podIPs[0].ip"),
    ({"status__podIPs": [{"address": "10.0.0.1"}]}, "status.podIPs[0].ip"),
    ({"status__podIPs": KeyError, "status__podIP": 7}, "status.podIP"),
    ({"status__qosClass": 3}, "status.qosClass"),
    ({"status__phase": ["Running"]}, "status.phase"),
])
def test_malformed_names_pod_and_field(over, path):
    with pytest.raises(PodParseError) as ei:
        PodInfo.from_dict(wire(**over))
    assert ei.value.path == path
    msg = str(ei.value)
    assert msg.startswith("parse pod ") and f"{path}: expected" in msg
    if path not in ("metadata",):
        assert "train-0" in msg or "metadata.name" in path


def test_not_an_object():
    with pytest.raises(PodParseError, match="expected an object"):
        PodInfo.from_dict("nope")


def test_host_network_dual_stack_pod():
    pod = {
        "metadata": {"uid": "u2", "namespace": "ns", "name": "p", "labels": {"tenant": "red"}},
        "spec": {"nodeName": "n1", "hostNetwork": True, "containers": [{"name": "c"}]},
        "status": {"phase": "Running", "qosClass": "Guaranteed", "podIP": "192.0.2.1",
                   "podIPs": [{"ip": "192.0.2.1"}, {"ip": "2001:db8::1"}]},
    }
    p = PodInfo.from_dict(pod)
    assert p == PodInfo(uid="u2", namespace="ns", name="p", labels={"tenant": "red"},
                        ips=("192.0.2.1", "2001:db8::1"), host_network=True, qos_class="Guaranteed",
                        phase="Running", node="n1")


def test_backoff_grows_caps_and_jitters():
    b = Backoff(initial_s=0.5, max_s=30, factor=2, jitter=0.5)
    rng = random.Random(1)
    for attempt in range(12):
        ceiling = min(30, 0.5 * 2 ** attempt)
        for _ in range(20):
            d = b.delay_s(attempt, rng)
            assert ceiling / 2 <= d <= ceiling
    assert Backoff(jitter=0).delay_s(100, rng) == 30


def test_backoff_is_a_function_of_attempt_and_rng():
    b = Backoff()
    first = [b.delay_s(i, random.Random(7)) for i in range(6)]
    assert first == [b.delay_s(i, random.Random(7)) for i in range(6)]  # same seed, same schedule


@pytest.mark.parametrize("exc, cls, status, text", [
    ("410", ResourceExpired, 410, "HTTP 410 Gone"),
    ("401", KubernetesError, 401, "check the service account's RBAC"),
    ("403", KubernetesError, 403, "check the service account's RBAC"),
    ("429", TransientKubernetesError, 429, "HTTP 429"),
    ("500", TransientKubernetesError, 500, "HTTP 500"),
    ("refused", TransientKubernetesError, None, "ConnectionRefusedError"),
    ("timeout", TransientKubernetesError, None, "ReadTimeoutError"),
    ("bug", KubernetesError, None, "unexpected KeyError"),
])
def test_map_api_error_is_the_one_status_code_mapping(exc, cls, status, text):
    import urllib3.exceptions

    from shaperd.discovery.kubernetes.errors import ApiStatus

    reasons = {"410": "Gone", "401": "Unauthorized", "403": "Forbidden", "429": "Too Many Requests",
               "500": "Internal Server Error"}
    e = {
        "refused": ConnectionRefusedError(111, "Connection refused"),
        "timeout": urllib3.exceptions.ReadTimeoutError(None, "/api/v1/pods", "Read timed out."),
        "bug": KeyError("code"),
    }.get(exc) or ApiStatus(int(exc), reasons[exc])
    got = map_api_error("watch", "pods on node n1", e)
    assert type(got) is cls and got.status == status
    assert isinstance(got, DiscoveryError)
    assert str(got).startswith("watch pods on node n1: ") and text in str(got)
    assert map_api_error("list", "pods", got) is got  # ours already: passed through unchanged
