"""Per-pod egress caps through the running daemon: an annotation followed live, its series, status and top.

The real daemon (``shaperd run --netns NODE --kubeconfig K``) follows a fake API server (tests/k8s_fake.py).
A pod annotated ``kubernetes.io/egress-bandwidth: 100M`` gets its own class; changing the annotation to 200M
changes the class in place (no restart of anything); removing it removes the class and the pod's series.
``shaperd status -o json`` and ``shaperd top -o json`` show the pod under its tenant. Every wait is on a
condition with a deadline that only bounds a failure.
"""

from __future__ import annotations

import json
import signal
import subprocess
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from shaperd.backends.common.classify import pod_minors
from shaperd.backends.htb import podlabels
from shaperd.backends.common.objects import ROOT_HANDLE, fmt_handle
from shaperd.core.ids import assign_minors
from tests import procs
from tests.k8s_fake import make_pod, write_kubeconfig

from .conftest import PY, SENDER, needs_root, run, wait_for
from .test_core import classes
from .test_k8s_e2e import _free_port

pytestmark = needs_root

CFG = """
node: {interfaces: [up0], capacity: 10Gbps}
tenants:
  - {name: tenant-a, bandwidthGuarantee: 4Gbps, bandwidthLimit: 6Gbps, priority: 100}
"""
MINORS = assign_minors(["tenant-a"])
A = ROOT_HANDLE | MINORS["tenant-a"]
UID = "0d1c2b3a-0000-4000-8000-000000000021"
POD = ROOT_HANDLE | pod_minors([UID], set(MINORS.values()))[UID]  # one pod: its minor from its uid alone
EGRESS = "kubernetes.io/egress-bandwidth"
DEADLINE = 30.0


def test_an_annotation_is_followed_live_with_its_series_status_and_top(bed, tmp_path, api):
    cfg = tmp_path / "t.yaml"
    cfg.write_text(CFG)
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api.url)
    bed.exec("sysctl", "-qw", "net.ipv4.ip_forward=1")
    pod_ns = bed.ns(f"{bed.tag}-pod")
    run("ip", "-n", bed.node, "link", "add", "cali2", "type", "veth", "peer", "name", "eth0", "netns", pod_ns)
    run("ip", "-n", bed.node, "addr", "add", "198.18.30.1/24", "dev", "cali2")
    run("ip", "-n", pod_ns, "addr", "add", "198.18.30.2/24", "dev", "eth0")
    run("ip", "-n", bed.node, "link", "set", "cali2", "up")
    run("ip", "-n", pod_ns, "link", "set", "eth0", "up")
    run("ip", "-n", pod_ns, "route", "add", "default", "via", "198.18.30.1")
    port = _free_port()
    log = tmp_path / "daemon.log"

    def tail() -> str:
        return log.read_text()[-3000:]

    def metrics() -> dict[tuple, float]:
        try:
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=20).read().decode()
        except OSError:
            return {}
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for fam in text_string_to_metric_families(text) for s in fam.samples}

    labels = (("device", "up0"), ("namespace", "team-a"), ("pod", "trainer-0"), ("tenant", "tenant-a"))

    def pod_series() -> dict[str, float]:
        return {n: v for (n, lbl), v in metrics().items() if n.startswith("shaperd_pod_transmit") and lbl == labels}

    def lands_in(cid: int, n: int = 10) -> bool:
        before = classes(bed).get(cid, {"packets": 0})["packets"]
        procs.run(["ip", "netns", "exec", pod_ns, PY, "-c", SENDER, "-", "198.18.0.2", "200", str(n)])
        return classes(bed).get(cid, {"packets": 0})["packets"] - before == n

    def ceil_bps(cid: int) -> int | None:
        c = classes(bed).get(cid)
        return c["ceil"] * 8 if c else None

    def annotate(value):
        def fn(p):
            ann = p["metadata"].setdefault("annotations", {})
            if value is None:
                ann.pop(EGRESS, None)
            else:
                ann[EGRESS] = value
        api.modify_pod(UID, fn)

    obj = make_pod("trainer-0", "node-1", namespace="team-a", ips=("198.18.30.2",),
                   labels={"training-tenant": "tenant-a"}, uid=UID)
    obj["metadata"]["annotations"] = {EGRESS: "100M"}
    api.add_pod(obj)
    with open(log, "w") as logf, procs.running(
        [PY, "-m", "shaperd", "--log-json", "run", "--config", str(cfg), "--netns", bed.node,
         "--node-name", "node-1", "--kubeconfig", str(kubeconfig), "--resync-interval", "600",
         "--metrics-address", f"127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=logf,
    ) as daemon:
        assert wait_for(lambda: ceil_bps(POD) == 100 * 10**6, DEADLINE), tail()
        assert wait_for(lambda: lands_in(POD, 5), DEADLINE), tail()
        assert wait_for(lambda: pod_series().get("shaperd_pod_transmit_limit_bytes_per_second") == 100 * 10**6 / 8,
                        DEADLINE), (pod_series(), tail())
        assert wait_for(lambda: (pod_series().get("shaperd_pod_transmit_bytes_total") or 0) >= 5 * 200, DEADLINE)
        # Only the capped pod has per-pod series.
        assert {lbl for (n, lbl) in metrics() if n.startswith("shaperd_pod_transmit")} == {labels}

        # status and top, run beside the daemon, show the pod under its tenant, with its cap (the labels the
        # daemon keeps for them: backends/htb/podlabels.py).
        assert podlabels.read(podlabels.path_for("/run", bed.node))[0][POD]["pod"] == "team-a/trainer-0"
        st = run(PY, "-m", "shaperd", "status", "--netns", bed.node, "--config", str(cfg), "-o", "json",
                 "--interval", "0.2", check=False)
        rows = json.loads(st.stdout.splitlines()[0])["classes"]
        i = next(n for n, r in enumerate(rows) if r["classid"] == fmt_handle(A))
        assert rows[i + 1]["pod"] == "team-a/trainer-0" and rows[i + 1]["tenant"] == "tenant-a", rows
        assert rows[i + 1]["cap_bps"] == 100 * 10**6 and rows[i + 1]["classid"] == fmt_handle(POD)
        text = run(PY, "-m", "shaperd", "status", "--netns", bed.node, "--config", str(cfg), "--interval", "0.2",
                   check=False).stdout
        assert "pod team-a/trainer-0 (cap 100Mbps)" in text, text
        tp = run(PY, "-m", "shaperd", "top", "--netns", bed.node, "--config", str(cfg), "--once", "-o", "json",
                 "--interval", "0.2", check=False)
        trows = json.loads(tp.stdout.splitlines()[-1])["tenants"]
        assert [(r["tenant"], r["pod"]) for r in trows] == [("tenant-a", None), ("tenant-a", "team-a/trainer-0")]

        # A changed annotation takes effect without restarting the pod: the same class, a new ceil.
        annotate("200M")
        assert wait_for(lambda: ceil_bps(POD) == 200 * 10**6, DEADLINE), tail()
        assert lands_in(POD, 5)
        assert wait_for(lambda: pod_series().get("shaperd_pod_transmit_limit_bytes_per_second") == 200 * 10**6 / 8,
                        DEADLINE), pod_series()

        # A removed annotation removes the cap, the class and the series.
        annotate(None)
        assert wait_for(lambda: ceil_bps(POD) is None, DEADLINE), tail()
        assert wait_for(lambda: lands_in(A, 5), DEADLINE), tail()
        assert wait_for(lambda: pod_series() == {}, DEADLINE), pod_series()
        assert not podlabels.path_for("/run", bed.node).exists()  # no capped pod: no labels for status
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(timeout=DEADLINE) == 0, tail()
