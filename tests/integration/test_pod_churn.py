"""Pod churn through the daemon ends in exactly the kernel state a fresh start makes.

The real daemon (``shaperd run --netns NODE --node-name node-1 --kubeconfig K``,
in this namespace so it reaches the fake API server on loopback) follows pods
that are created and deleted over and over (bench/pod_churn.py does 1,000
cycles and measures memory; this is its correctness half, with asserts). Each
cycle makes a routed veth and the pod, waits until shaperd has put its mark
program on the veth and its address filters on the uplink, deletes it (API
first or veth first, alternating: the CNI and the API server race in real
clusters) and waits until nothing of it is left. A share of the pods carries
``kubernetes.io/egress-bandwidth`` (tests/routed_pods.py's ``annotation_plan``):
each of those is enforced once its addresses map to a class of its own; some
change their annotation mid-life (a new value, removed, added), and the steady
pods' annotations change half-way. At the end no class, filter, map entry or
mark program of a deleted pod is left (``leftovers``, shown to catch a planted
one), and the node's normalised tc state (map entries included) must equal the
state before the churn and the state that a teardown plus a fresh apply of the
same config and pods makes.
"""

from __future__ import annotations

import signal
import subprocess

import pytest

from shaperd.core.config import load_text
from shaperd.engine.probe import probe_capabilities
from tests.k8s_fake import write_kubeconfig
from tests.routed_pods import (CFG, EGRESS_ANNOTATION, NODE_NAME, Kernel, PodSpec, add_routed_pods, annotation_plan,
                               enforced, gone, leftovers, own_class, remove_routed_pod, state_diff,
                               steady_annotation, tenant_for)

from .conftest import PY, needs_root, wait_for

pytestmark = needs_root

CYCLES = 40
STEADY = 6  # tenant-a by label, tenant-b by namespace, one in no tenant


def _ops(report) -> list[str]:
    return [f"{op.device}: {op.describe()} ({op.reason})" for d in report.devices for op in d.ops]


def _annotate(api, pod: PodSpec, value: str | None) -> None:
    def fn(obj):
        ann = obj["metadata"].setdefault("annotations", {})
        if value is None:
            ann.pop(EGRESS_ANNOTATION, None)
        else:
            ann[EGRESS_ANNOTATION] = value
    pod.egress = value
    api.modify_pod(pod.uid, fn)


@pytest.mark.slow  # 8-35 s (--durations, quiet)
def test_churn_ends_in_the_state_a_fresh_start_makes(bed, tmp_path, api):
    caps = probe_capabilities()  # before any netlink socket of ours is open
    if not caps.bpf:
        pytest.skip("cls_bpf not available: no mark programs to churn on this kernel")
    cfg = load_text(CFG)
    pods_ns = bed.ns(f"{bed.tag}-pods")
    bed.exec("sysctl", "-qw", "net.ipv4.ip_forward=1")
    steady = [PodSpec("s", i, tenant_for(i), egress=steady_annotation(i, before_half=True)) for i in range(STEADY)]
    add_routed_pods(bed.node, pods_ns, steady)
    for p in steady:
        api.add_pod(p.api_object())
    (tmp_path / "t.yaml").write_text(CFG)
    log_path = tmp_path / "daemon.log"
    with open(log_path, "w") as log:  # a file, not a pipe: 40 cycles of JSON lines would fill a pipe
        daemon = bed.spawn([PY, "-m", "shaperd", "--log-json", "run", "--config", str(tmp_path / "t.yaml"),
                            "--netns", bed.node, "--node-name", NODE_NAME,
                            "--kubeconfig", str(write_kubeconfig(tmp_path / "kubeconfig", api.url)),
                            # no periodic resync to paper over a missed event; no port to collide on
                            "--resync-interval", "600", "--metrics-address", ""],
                           stdout=subprocess.DEVNULL, stderr=log)

    def tail() -> str:
        return log_path.read_text()[-3000:]

    deleted: dict[int, str] = {}  # the classes capped churn pods had
    deleted_pods: list[PodSpec] = []
    with Kernel(bed.node) as k:
        tenant_steady = [p for p in steady if p.tenant or p.egress]
        assert wait_for(lambda: all(enforced(k, p) for p in tenant_steady), 30), tail()

        for c in range(1, CYCLES + 1):
            if c == CYCLES // 2:  # half-way, the steady pods' annotations change (one new value, one gone, one new)
                for i, p in enumerate(steady):
                    new = steady_annotation(i, before_half=False)
                    if new != p.egress:
                        _annotate(api, p, new)
                assert wait_for(lambda: all(enforced(k, p) for p in tenant_steady), 10), tail()
            first, then = annotation_plan(c)
            pod = PodSpec("c", c, "tenant-a" if c % 2 else "tenant-b", egress=first)
            add_routed_pods(bed.node, pods_ns, [pod])
            api.add_pod(pod.api_object())
            assert wait_for(lambda: enforced(k, pod), 10), f"cycle {c}: {pod.name} never enforced\n{tail()}"
            if pod.egress is not None:
                deleted[own_class(k, pod)] = pod.name
            if then != first:  # its annotation changes while it lives
                _annotate(api, pod, then)
                assert wait_for(lambda: enforced(k, pod), 10), f"cycle {c}: {pod.name} {first} -> {then}\n{tail()}"
                if pod.egress is not None:
                    deleted[own_class(k, pod)] = pod.name
            api_first = c % 2 == 0
            if not api_first:
                remove_routed_pod(bed.node, pod)
                k.forget(pod.host_if)
            api.delete_pod(pod.uid)
            assert wait_for(lambda: gone(k, pod, api_first), 10), f"cycle {c}: {pod.name} left behind\n{tail()}"
            if api_first:
                remove_routed_pod(bed.node, pod)
                k.forget(pod.host_if)
            deleted_pods.append(pod)
            assert daemon.poll() is None, tail()
        assert deleted, "no capped pod was churned"

        # Converged when a fresh Reconciler, told the same pods, finds nothing to do.
        infos = [p.info() for p in steady]
        fresh = k.reconciler(caps, lambda: infos)
        assert wait_for(lambda: not _ops(fresh.diff(cfg)), 10), _ops(fresh.diff(cfg))
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(timeout=15) == 0, tail()
        live = {own_class(k, p) for p in steady if p.egress}
        assert None not in live
        assert leftovers(k, deleted, deleted_pods, live) == []
        _planted_leftover_is_caught(bed, k, deleted, deleted_pods, live)
        churned = k.state()

        torn = k.reconciler(caps, lambda: infos).teardown()
        assert torn.ok, torn.devices
        left = k.state()
        assert not [q for q in left["qdiscs"] if q[3] == "htb"] and not left["classes"]
        assert not [f for f in left["filters"] if "shpd" in repr(f)] and not left["maps"]

        again = k.reconciler(caps, lambda: infos).apply(cfg)
        assert again.ok and again.changes > 0, again.devices
        assert state_diff(churned, k.state()) == {}
        # ... and the steady pods' tree is the one a fresh start with their final annotations makes
        assert {p.name for p in steady if p.egress} and all(enforced(k, p) for p in tenant_steady)


def _planted_leftover_is_caught(bed, k, deleted: dict[int, str], deleted_pods, live) -> None:
    """The check can fail: a class of a deleted pod put back with tc, and (map path) a source entry of one
    of its addresses written into the classifier's map, are both named; removed again, it is clean."""
    from shaperd.backends.common import mapcls

    cid, name = next(iter(sorted(deleted.items())))
    victim = next(p for p in deleted_pods if p.name == name)
    handle = f"{cid >> 16:x}:{cid & 0xFFFF:x}"
    # Under the root class (inner already): a child of a tenant's leaf would turn it inner and change its queue.
    bed.exec("tc", "class", "add", "dev", "up0", "parent", "7368:1", "classid", handle, "htb", "rate", "1mbit")
    planted = [f"class {handle} of deleted pod {name}"]
    maps = k.classifier_entries()
    if maps:
        import ipaddress
        import json as _json

        from shaperd.backends.common import kernel_classifier as bpf_classify

        out = _json.loads(bed.exec("tc", "-j", "filter", "show", "dev", "up0", "egress").stdout)
        prog = next(f["options"]["prog"]["id"] for f in out if f.get("options", {}).get("bpf_name", "").startswith("shpd_c"))
        key = mapcls.src_key(ipaddress.ip_network(victim.ip4))
        with bpf_classify.ClassifierMaps.adopt(prog) as m:
            m.maps["src4"].update(key, mapcls.value(cid))
        planted.append(f"map src4 entry {key.hex()} -> {handle} (deleted pod {name})")
    found = leftovers(k, deleted, deleted_pods, live)
    for what in planted:
        assert what in found, (what, found)
    assert any(f.startswith(f"source entry {victim.ip4} of deleted pod {name}") for f in found) or not maps
    bed.exec("tc", "class", "del", "dev", "up0", "classid", handle)
    if maps:
        with bpf_classify.ClassifierMaps.adopt(prog) as m:
            m.maps["src4"].delete(key)
    assert leftovers(k, deleted, deleted_pods, live) == []

