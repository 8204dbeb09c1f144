"""Volcano: pod -> queue (PodGroup, then the queue-name label/annotation), tenants by queue, priority from weight."""

from __future__ import annotations

import pytest

from shaperd.core import config
from shaperd.backends.htb.plan import htb_prios
from shaperd.discovery.kubernetes.pods import PodInfo
from shaperd.discovery.kubernetes.volcano import queue_of, queue_weights, uses_volcano, with_queue_priorities
from shaperd.core.errors import ConfigError
from shaperd.core.inventory import Pod
from shaperd.core.tenancy import pod_tenants

CFG = config.load_text("""
tenants:
  - name: a
    bandwidthGuarantee: 1Gbps
    priority: 1
    priorityFrom: volcanoQueue
    match: {volcanoQueues: [tenant-a-training, tenant-a-eval]}
  - name: b
    bandwidthGuarantee: 1Gbps
    priority: 50
    match: {volcanoQueues: [tenant-b-training]}
""")


def pod(labels=None, annotations=None, ns="team") -> PodInfo:
    return PodInfo.from_dict({"metadata": {"uid": "u1", "namespace": ns, "name": "p", "labels": labels or {},
                                           "annotations": annotations or {}}})


GROUPS = {"team/job-1": {"spec": {"queue": "tenant-a-training"}}, "team/no-queue": {"spec": {}}}


@pytest.mark.parametrize("p,want", [
    (pod(annotations={"scheduling.k8s.io/group-name": "job-1"}), "tenant-a-training"),
    # the PodGroup wins over the fallbacks
    (pod(labels={"volcano.sh/queue-name": "x"}, annotations={"scheduling.k8s.io/group-name": "job-1"}),
     "tenant-a-training"),
    # a PodGroup in another namespace is not the pod's
    (pod(annotations={"scheduling.k8s.io/group-name": "job-1"}, ns="other"), None),
    (pod(annotations={"scheduling.k8s.io/group-name": "no-queue", "volcano.sh/queue-name": "q2"}), "q2"),
    (pod(labels={"volcano.sh/queue-name": "q3"}), "q3"),
    (pod(annotations={"scheduling.volcano.sh/queue-name": "q4"}), "q4"),
    (pod(labels={"scheduling.volcano.sh/queue-name": "q5"}, annotations={"volcano.sh/queue-name": "q6"}), "q6"),
    (pod(), None),
])
def test_queue_of(p, want):
    assert queue_of(p, GROUPS) == want


def test_unread_annotations_are_dropped_so_they_do_not_look_like_a_change():
    a = pod(annotations={"volcano.sh/queue-name": "q", "kubectl.kubernetes.io/last-applied": "1"})
    b = pod(annotations={"volcano.sh/queue-name": "q", "kubectl.kubernetes.io/last-applied": "2"})
    assert a == b and dict(a.annotations) == {"volcano.sh/queue-name": "q"}


def test_pods_go_to_the_tenant_of_their_queue():
    pods = (Pod("u1", "team", "p1", volcano_queue="tenant-a-eval"), Pod("u2", "team", "p2", volcano_queue="zzz"),
            Pod("u3", "team", "p3", volcano_queue="tenant-b-training"), Pod("u4", "team", "p4"))
    assert pod_tenants(CFG, pods)[0] == {"u1": "a", "u3": "b"}


def test_priority_follows_the_largest_known_queue_weight():
    queues = {"tenant-a-training": {"spec": {"weight": 10}}, "tenant-a-eval": {"spec": {"weight": 100}},
              "bad": {"spec": {"weight": "x"}}}
    w = queue_weights(queues)
    assert w == {"tenant-a-training": 10, "tenant-a-eval": 100}
    eff = with_queue_priorities(CFG, w)
    assert eff.tenant("a").priority == 100 and eff.tenant("b").priority == 50  # b has no priorityFrom
    assert htb_prios(eff.tenants) == {"a": 0, "b": 1}
    assert htb_prios(with_queue_priorities(CFG, {"tenant-a-training": 10}).tenants) == {"a": 1, "b": 0}
    assert with_queue_priorities(CFG, {}) is CFG  # unknown queue: the configured priority stays
    assert uses_volcano(CFG) and not uses_volcano(config.load_text("tenants: [{name: a, bandwidthGuarantee: 1Gbps}]"))


@pytest.mark.parametrize("tenant,where", [
    ("{name: a, bandwidthGuarantee: 1Gbps, priorityFrom: queue}", "priorityFrom"),
    ("{name: a, bandwidthGuarantee: 1Gbps, priorityFrom: volcanoQueue}", "priorityFrom"),
    ("{name: a, bandwidthGuarantee: 1Gbps, match: {volcanoQueues: [1]}}", "match.volcanoQueues"),
])
def test_bad_volcano_keys_name_the_field(tenant, where):
    with pytest.raises(ConfigError, match=f"tenants\\[0\\].{where}"):
        config.load_text(f"tenants: [{tenant}]")
