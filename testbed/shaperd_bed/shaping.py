"""How the bed's node is shaped: through shaperd's CLI, or by hand-written tc.

* :func:`shaperd_config` builds the tenants file (as a dict) from the bed's
  actual addresses and interface names; :func:`write_config` writes the YAML.
* :func:`program_node` is the hook the shaped scenarios call: it runs
  ``ip netns exec NODE <python> -m shaperd apply --config FILE``;
  :func:`unprogram_node` runs ``... -m shaperd teardown``.
* :func:`hand_tc_commands` is the operator's baseline: ``tc`` lines exactly as
  typed from the HTB manual (default burst/cburst, default leaf qdiscs, u32
  ``match ip src`` filters, root class at the link rate).
* :func:`uplink_state` reads back what is on the uplink (``tc -s -j``).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import yaml

from .netns import TC, CommandError, run

if TYPE_CHECKING:  # pragma: no cover
    from .topology import Bed

ProgramHook = Callable[["Bed", dict], None]


def fmt_rate(bps: float) -> str:
    """bits/s -> the tenants file's SI unit string (exact, largest whole unit)."""
    b = int(round(bps))
    for unit, mult in (("Gbps", 10**9), ("Mbps", 10**6), ("Kbps", 10**3)):
        if b >= mult and b % mult == 0:
            return f"{b // mult}{unit}"
    return f"{b}bps"


def shaperd_config(bed: "Bed", *, capacity_bps: float | None = None, reserve_bps: float | None = 10e6,
                   limits: dict[str, float] | None = None, guarantees: dict[str, float] | None = None,
                   extra_node: dict | None = None) -> dict[str, Any]:
    """The tenants file for this bed.

    *capacity_bps* defaults to the wire's TBF rate.  *limits*/*guarantees* map
    tenant short names to bit/s overriding the fractions of the link.
    """
    link = bed.link_bps
    cap = int(capacity_bps if capacity_bps is not None else link)
    node: dict[str, Any] = {"interfaces": [bed.uplink], "capacity": fmt_rate(cap)}
    if reserve_bps is not None:
        node["reserve"] = fmt_rate(reserve_bps)
    if extra_node:
        node.update(extra_node)
    tenants = []
    for t in bed.config.tenants:
        g = (guarantees or {}).get(t.short, t.guarantee * link)
        lim = (limits or {}).get(t.short, t.limit * link)
        tenants.append({
            "name": t.name,
            "bandwidthGuarantee": fmt_rate(g),
            "bandwidthLimit": fmt_rate(lim),
            "priority": t.priority,
            "match": {"cidrs": [t.cidr]},
        })
    return {"node": node, "tenants": tenants}


def write_config(bed: "Bed", config: dict, name: str = "tenants.yaml") -> str:
    os.makedirs(bed.workdir, exist_ok=True)
    path = os.path.join(bed.workdir, name)
    with open(path, "w") as f:
        yaml.safe_dump(config, f, sort_keys=False)
    return path


def shaperd_cli() -> list[str]:
    """argv prefix that runs shaperd's CLI with the bed's interpreter.

    ``python -m shaperd`` (needs ``shaperd/__main__.py``); until that module
    exists, ``python -m shaperd.cli.main`` is the same entry point.
    """
    import importlib.util

    try:
        has_main = importlib.util.find_spec("shaperd.__main__") is not None
    except (ImportError, ValueError):
        has_main = False
    return [sys.executable, "-m", "shaperd" if has_main else "shaperd.cli.main"]


def shaperd_available() -> bool:
    """True when ``python -m shaperd --help`` works (the CLI exists)."""
    try:
        p = subprocess.run([*shaperd_cli(), "--help"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return p.returncode == 0


class ShaperdError(RuntimeError):
    """shaperd's CLI failed inside the bed."""


def program_node(bed: "Bed", config: dict) -> None:
    """Apply *config* to the node with shaperd's normal CLI, inside the node netns."""
    path = write_config(bed, config)
    bed._shaperd_config_path = path  # type: ignore[attr-defined]
    try:
        run([*shaperd_cli(), "apply", "--config", path], bed.ns["node"], timeout=120)
    except CommandError as e:
        raise ShaperdError(f"shaperd apply failed: {e.stderr.strip() or e}") from e


def unprogram_node(bed: "Bed") -> None:
    """``shaperd teardown`` in the node netns; then make sure the uplink is bare."""
    path = getattr(bed, "_shaperd_config_path", None)
    p = run([*shaperd_cli(), "teardown"], bed.ns["node"], check=False, timeout=120)
    if p.returncode == 2 and path:  # usage error: this CLI wants the config too
        p = run([*shaperd_cli(), "teardown", "--config", path], bed.ns["node"], check=False, timeout=120)
    if p.returncode != 0:
        bed.clear_node_shaping()
        raise ShaperdError(f"shaperd teardown failed (rc={p.returncode}): {p.stderr.strip()}")
    bed.clear_node_shaping()  # no-op when teardown did its job


def hand_tc_commands(bed: "Bed", limits: dict[str, float] | None = None,
                     root_bps: float | None = None) -> list[list[str]]:
    """The operator's baseline, as typed from the manual (LARTC/tc-htb(8) style).

    ::

        tc qdisc add dev UP root handle 1: htb default 30
        tc class add dev UP parent 1: classid 1:1 htb rate 1000mbit
        tc class add dev UP parent 1:1 classid 1:10 htb rate 400mbit ceil 600mbit prio 1
        tc class add dev UP parent 1:1 classid 1:20 htb rate 200mbit ceil 400mbit prio 2
        tc class add dev UP parent 1:1 classid 1:30 htb rate 10mbit ceil 1000mbit prio 3
        tc filter add dev UP protocol ip parent 1:0 prio 1 u32 match ip src 198.18.1.0/24 flowid 1:10
        tc filter add dev UP protocol ip parent 1:0 prio 1 u32 match ip src 198.18.2.0/24 flowid 1:20
    """
    up = bed.uplink
    link_mbit = int(round((root_bps or bed.link_bps) / 1e6))
    cmds = [
        [TC, "qdisc", "add", "dev", up, "root", "handle", "1:", "htb", "default", "30"],
        [TC, "class", "add", "dev", up, "parent", "1:", "classid", "1:1", "htb", "rate", f"{link_mbit}mbit"],
    ]
    # higher tenant priority first => lower HTB prio number
    order = sorted(bed.config.tenants, key=lambda t: -t.priority)
    for i, t in enumerate(order):
        cls = f"1:{10 * (i + 1)}"
        rate = int(round(t.guarantee * bed.link_bps / 1e6))
        ceil = int(round((limits or {}).get(t.short, t.limit * bed.link_bps) / 1e6))
        cmds.append([TC, "class", "add", "dev", up, "parent", "1:1", "classid", cls, "htb",
                     "rate", f"{rate}mbit", "ceil", f"{ceil}mbit", "prio", str(i + 1)])
    dflt = f"1:{10 * (len(order) + 1)}"
    cmds.append([TC, "class", "add", "dev", up, "parent", "1:1", "classid", dflt, "htb",
                 "rate", "10mbit", "ceil", f"{link_mbit}mbit", "prio", str(len(order) + 1)])
    for i, t in enumerate(order):
        cmds.append([TC, "filter", "add", "dev", up, "protocol", "ip", "parent", "1:0", "prio", "1",
                     "u32", "match", "ip", "src", t.cidr, "flowid", f"1:{10 * (i + 1)}"])
    if dflt != "1:30":  # keep "default 30" pointing at the default class
        cmds[0][-1] = dflt.split(":")[1]
    return cmds


def program_hand_tc(bed: "Bed", limits: dict[str, float] | None = None, root_bps: float | None = None) -> None:
    for argv in hand_tc_commands(bed, limits, root_bps):
        run(argv, bed.ns["node"])


def unprogram_hand_tc(bed: "Bed") -> None:
    bed.clear_node_shaping()


def uplink_state(bed: "Bed") -> dict[str, Any]:
    """What is on the uplink: qdiscs (tc JSON), class counters by handle, filters (text)."""
    from .parse import parse_tc_class_stats

    out: dict[str, Any] = {}
    p = run([TC, "-s", "-j", "qdisc", "show", "dev", bed.uplink], bed.ns["node"], check=False)
    try:
        out["qdisc"] = json.loads(p.stdout or "[]")
    except ValueError:
        out["qdisc"] = []
    p = run([TC, "-s", "class", "show", "dev", bed.uplink], bed.ns["node"], check=False)
    out["class"] = parse_tc_class_stats(p.stdout)
    p = run([TC, "filter", "show", "dev", bed.uplink], bed.ns["node"], check=False)
    out["filter_text"] = p.stdout
    return out


def qdisc_counters(bed: "Bed") -> dict[str, dict[str, int]]:
    """Root-qdisc byte/packet/drop/overlimit counters of the uplink and the wire.

    Where drops happen tells where the queue formed: in the node's HTB (as
    intended) or in the wire's TBF (the emulated NIC).
    """
    out: dict[str, dict[str, int]] = {}
    for name, ns, dev in (("uplink", bed.ns["node"], bed.uplink), ("wire", bed.ns["wire"], bed.wire_out)):
        p = run([TC, "-s", "-j", "qdisc", "show", "dev", dev], ns, check=False)
        try:
            qs = json.loads(p.stdout or "[]")
        except ValueError:
            qs = []
        tot = {"bytes": 0, "packets": 0, "drops": 0, "overlimits": 0, "kind": ""}
        for q in qs:
            if q.get("root"):
                tot["kind"] = q.get("kind", "")
            # sum over every qdisc of the device (HTB leaves hold the drops)
            if q.get("kind") in ("noqueue",):
                continue
            is_root = bool(q.get("root"))
            if is_root:
                tot["bytes"] += int(q.get("bytes", 0))
                tot["packets"] += int(q.get("packets", 0))
            tot["drops"] += int(q.get("drops", 0)) if is_root else 0
            tot["overlimits"] += int(q.get("overlimits", 0)) if is_root else 0
        out[name] = tot
    return out


def counters_delta(before: dict, after: dict) -> dict[str, dict[str, Any]]:
    d: dict[str, dict[str, Any]] = {}
    for k, a in after.items():
        b = before.get(k, {})
        same = b.get("kind") == a.get("kind")
        d[k] = {f: (a.get(f, 0) - b.get(f, 0)) if same else a.get(f, 0)
                for f in ("bytes", "packets", "drops", "overlimits")}
        d[k]["kind"] = a.get("kind", "")
    return d


def prerequisites() -> list[str]:
    """Problems that prevent running the bed (empty list = all good)."""
    problems = []
    if os.geteuid() != 0:
        problems.append("must run as root (network namespaces, veth, tc)")
    for prog, pkg in (("ip", "iproute2"), ("tc", "iproute2"), ("ss", "iproute2"),
                      ("iperf3", "iperf3"), ("ping", "iputils-ping"), ("sysctl", "procps")):
        if shutil.which(prog) is None:
            problems.append(f"'{prog}' not found: install it (apt-get install -y {pkg})")
    return problems
