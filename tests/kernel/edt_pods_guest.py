"""In the QEMU guest (Debian 6.1, the real sch_fq): a per-pod egress cap on the edt data plane.

``pod_caps(bed)`` (called by tests/kernel/edt_guest.py, once in the tier, ``--repeats`` times with
``--bench --pod-caps``) reconciles the edt uplink of the bed through shaperd's engine with two pods of
tenant gold, given to it as the Kubernetes watcher would (PodInfo with the annotation):

- ``gold/capped`` (198.18.7.11, ``kubernetes.io/egress-bandwidth: 8M``, a fifth of the 40 Mbit/s) and
  ``gold/mate`` (198.18.7.12, no annotation): their senders bind to those addresses and set no
  SO_PRIORITY, so the map classifier (src4, the pod's address) says whose packet it is: the capped
  pod's own class id, the mate's tenant's;
- bronze (guarantee 20 %, limit 50 %) sends with SO_PRIORITY = its class id, as in the isolation run;
- schedule: the two pods alone for ``alone_s`` (the mate borrows what the cap leaves), then bronze wakes
  for ``both_s`` (the isolation guarantees with a capped pod in place); the rate controller runs at 20 ms.

Recorded: the reconcile's writes and a resync's (none), the stamper's parents and rates read back from its
maps, the bytes the receiver got per flow (100 ms bins) and the stamper's counters per key. Records only;
tests/kernel/test_edt.py judges structure and byte bounds, bench/edt_qemu.py --pod-caps the rates.
"""

from __future__ import annotations

from .edt_guest import BIN_S, BRONZE, CAPACITY_MBIT, GOLD, NODE_IF, Bed, classids, mbit, sh, traffic

CAPPED = {"name": "capped", "ip": "198.18.7.11", "cap_mbit": 8, "port": 5003}
MATE = {"name": "mate", "ip": "198.18.7.12", "port": GOLD["port"]}


def tenants_yaml(capacity_mbit: int = CAPACITY_MBIT) -> str:
    """The isolation run's tenants, each matching its namespace (so the pods of gold/ are gold's)."""
    lines = [f"node: {{interfaces: [{NODE_IF}], capacity: {capacity_mbit}Mbps, dataplane: edt}}", "tenants:"]
    for t in (GOLD, BRONZE):
        lines.append(f"  - name: {t['name']}")
        lines.append(f"    bandwidthGuarantee: {int(t['g'] * capacity_mbit * 1000)}Kbps")
        if t["limit"]:
            lines.append(f"    bandwidthLimit: {int(t['limit'] * capacity_mbit * 1000)}Kbps")
        lines.append(f"    priority: {t['prio']}")
        lines.append(f"    match: {{namespaces: [{t['name']}]}}")
    return "\n".join(lines) + "\n"


def pod_infos():
    from shaperd.core.podcaps import EGRESS_ANNOTATION
    from shaperd.discovery.kubernetes.pods import FrozenMap, PodInfo

    def info(p, annotations):
        return PodInfo(uid=f"uid-{p['name']}", namespace="gold", name=p["name"], labels=FrozenMap({}),
                       ips=(p["ip"],), host_network=False, qos_class="BestEffort", phase="Running", node="guest",
                       annotations=FrozenMap(annotations))

    return [info(CAPPED, {EGRESS_ANNOTATION: f"{CAPPED['cap_mbit']}M"}), info(MATE, {})]


def pod_caps(bed: Bed, alone_s: float = 3.0, both_s: float = 4.0) -> dict:
    from shaperd.backends.edt import kernel_stamper
    from shaperd.backends.edt.controller import rate_bps_of_q16
    from shaperd.backends.edt.loop import EdtLoop, maps_opener
    from shaperd.core import config
    from shaperd.engine.probe import probe_capabilities
    from shaperd.engine.reconciler import open_node
    from shaperd.kernel.rtnl import RtnlReader

    for p in (CAPPED, MATE):  # the pods' addresses, on the node (their packets leave through the uplink)
        sh(["ip", "-n", bed.node, "addr", "add", f"{p['ip']}/32", "dev", NODE_IF])
    cfg = config.load_text(tenants_yaml())
    rec = open_node(probe_capabilities(), netns=bed.node, pods_source=pod_infos)
    first = rec.apply(cfg)
    second = rec.apply(cfg)
    desired = rec.plan(cfg).desired["edt"]
    (dp,) = desired.devices
    (pod,) = dp.pods
    out: dict = {
        "first": [o.describe() for t in first.devices for o in t.ops],
        "first_failed": [str(e) for t in first.devices for _, e in t.failed],
        "errors": [t.error or t.blocked for t in first.devices if t.error or t.blocked],
        "problems": [str(p) for p in first.problems], "resync_changes": second.changes,
        "pod": {"key": pod.key, "parent": pod.parent, "rate_bps": pod.rate_bps, "ref": pod.ref},
        "gold_key": dp.tenant_keys["gold"], "alone_s": alone_s, "both_s": both_s, "cap_mbit": CAPPED["cap_mbit"],
    }
    with RtnlReader(bed.node) as reader:
        with kernel_stamper.open_for_device(reader, dp.ifindex, dp.device, dp.stamper.name) as maps:
            out["parents"] = maps.read_parents()
            out["pod_map_rate_bps"] = rate_bps_of_q16(maps.read_rates([pod.key])[pod.key])
    ids = classids(cfg)
    loop = EdtLoop(maps_opener(bed.node))
    loop.set_targets(desired.devices)
    loop.start()
    try:
        end = alone_s + both_s
        res = traffic(bed, [(CAPPED["port"], 0, 0.0, end, CAPPED["ip"]), (MATE["port"], 0, 0.0, end, MATE["ip"]),
                            (BRONZE["port"], ids["bronze"], alone_s, end)], end + 0.5)
        pods_seen = loop.pod_snapshot()
    finally:
        loop.stop()
    with RtnlReader(bed.node) as reader:
        with kernel_stamper.open_for_device(reader, dp.ifindex, dp.device, dp.stamper.name) as maps:
            stats = maps.read_stats()
    keys = {"capped": pod.key, "gold": dp.tenant_keys["gold"], "bronze": dp.tenant_keys["bronze"]}
    out["stamper"] = {n: list(stats[k]) if k in stats else None for n, k in keys.items()}
    out["loop_pod_rows"] = [list(r) for r in pods_seen]
    g = {p: {int(k): v for k, v in b.items()} for p, b in res["bins"].items()}
    capped, mate, bronze = (g.get(str(f["port"]), {}) for f in (CAPPED, MATE, BRONZE))
    settle = 1.0
    out.update({
        "sent": res["sent"], "packets": res["packets"],
        "capped_until_s": res["sent_until_s"][0], "mate_until_s": res["sent_until_s"][1],
        "bronze_until_s": res["sent_until_s"][2],
        # What the pass/fail tests check: bytes against what the stamps allow, and against each other.
        "capped_bytes": sum(capped.values()), "mate_bytes": sum(mate.values()),
        "bronze_bytes": sum(bronze.values()),
        "both_bytes": {n: sum(v for k, v in b.items() if k >= round(alone_s / BIN_S))
                       for n, b in (("capped", capped), ("mate", mate), ("bronze", bronze))},
        # Rates for bench/edt_qemu.py (after a settling second in each phase).
        "capped_alone_mbit": mbit(capped, settle, alone_s), "mate_alone_mbit": mbit(mate, settle, alone_s),
        "capped_both_mbit": mbit(capped, alone_s + settle, end), "mate_both_mbit": mbit(mate, alone_s + settle, end),
        "bronze_both_mbit": mbit(bronze, alone_s + settle, end),
    })
    cap = CAPACITY_MBIT
    out["cap_ratio_alone"] = out["capped_alone_mbit"] / CAPPED["cap_mbit"]
    out["cap_ratio_both"] = out["capped_both_mbit"] / CAPPED["cap_mbit"]
    out["guarantee_gold"] = (out["capped_both_mbit"] + out["mate_both_mbit"]) / (GOLD["g"] * cap)
    out["guarantee_bronze"] = out["bronze_both_mbit"] / (BRONZE["g"] * cap)
    out["utilisation_alone"] = (out["capped_alone_mbit"] + out["mate_alone_mbit"]) / cap
    out["utilisation"] = (out["capped_both_mbit"] + out["mate_both_mbit"] + out["bronze_both_mbit"]) / cap
    return out
