"""Issue 14, least privilege: the daemon with only the capabilities the DaemonSet grants
(daemonset/base/daemonset.yaml's securityContext, read from the manifest so the test follows it) still
enforces: its effective set is exactly those, and the tree, filters and mark program are read back
from the kernel. Without NET_ADMIN nothing is written.

The capabilities are dropped with setpriv(1) (util-linux): the bounding set limited to the granted
ones, inheritable and ambient cleared, so a root process execs with exactly those permitted and
effective, as the container runtime starts it. The daemon runs in the node namespace itself (as the
DaemonSet does in the host's, hostNetwork), not through --netns.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess

import pytest
import yaml

from .conftest import PY, ROOT, needs_root, wait_for
from .test_core import A, B, classes

pytestmark = [needs_root, pytest.mark.skipif(not shutil.which("setpriv"), reason="needs setpriv (util-linux)")]

# linux/capability.h
CAP_BITS = {"NET_ADMIN": 12, "SYS_ADMIN": 21, "BPF": 39, "NET_RAW": 13, "SYS_RESOURCE": 24, "PERFMON": 38}
CFG = """node: {interfaces: [up0], capacity: 100Gbps}
tenants:
  - {name: tenant-a, bandwidthGuarantee: 40Gbps, bandwidthLimit: 60Gbps, priority: 100,
     match: {cidrs: [198.18.1.0/24], interfaces: [cs*]}}
  - {name: tenant-b, bandwidthGuarantee: 20Gbps, bandwidthLimit: 40Gbps, priority: 50, match: {cidrs: [198.18.2.0/24]}}
"""


def granted() -> list[str]:
    for doc in yaml.safe_load_all((ROOT / "daemonset" / "base" / "daemonset.yaml").read_text()):
        if isinstance(doc, dict) and doc.get("kind") == "DaemonSet":
            c = next(c for c in doc["spec"]["template"]["spec"]["containers"] if c["name"] == "shaperd")
            caps = c["securityContext"]["capabilities"]
            assert caps["drop"] == ["ALL"]
            return list(caps["add"])
    raise AssertionError("no DaemonSet in daemonset/base/daemonset.yaml")


def setpriv(caps: list[str]) -> list[str]:
    bounding = ",".join(["-all"] + [f"+{c.lower()}" for c in caps])
    return ["setpriv", "--inh-caps=-all", "--ambient-caps=-all", f"--bounding-set={bounding}", "--"]


def cap_eff(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    raise AssertionError("no CapEff")


def bpf_filters(bed) -> str:
    """shaperd's BPF classifiers: classic cls_bpf on the HTB root, or the map classifier on clsact egress."""
    return (bed.exec("tc", "filter", "show", "dev", "up0", check=False).stdout
            + bed.exec("tc", "filter", "show", "dev", "up0", "egress", check=False).stdout)


def test_daemon_with_only_the_daemonset_capabilities_enforces(bed, tmp_path):
    caps = granted()
    assert set(caps) == {"NET_ADMIN", "BPF"}, caps  # docs/operations.md#privileges documents these
    cfg = tmp_path / "t.yaml"
    cfg.write_text(CFG)
    daemon = bed.spawn([*setpriv(caps), PY, "-m", "shaperd", "--log-json", "run", "--config", str(cfg),
                        "--resync-interval", "1", "--metrics-address", "", "--no-kubernetes"], bed.node,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    # ip netns exec execs setpriv which execs python: one pid; its effective set is exactly the grant.
    want = sum(1 << CAP_BITS[c] for c in caps)
    assert wait_for(lambda: daemon.poll() is not None or cap_eff(daemon.pid) == want, 10)
    assert cap_eff(daemon.pid) == want, hex(cap_eff(daemon.pid))
    assert wait_for(lambda: A in classes(bed) and B in classes(bed), 30)
    assert classes(bed)[A]["ceil"] == 60 * 10**9 // 8
    out = bpf_filters(bed)
    assert "shpd" in out, out  # a BPF classifier of match.interfaces: the probe found bpf usable
    if os.environ.get("SHAPERD_BPFFS_ROOT"):  # a (private) bpffs to pin in: the map classifier is adopted
        assert "shpd_c" in bed.exec("tc", "filter", "show", "dev", "up0", "egress").stdout, out
    else:  # no bpffs and no SYS_ADMIN: the u32 path
        assert "198.18.1.0/24" in bed.exec("tc", "filter", "show", "dev", "up0").stdout or "c6120100" in out
    # Drift is repaired with the same capabilities.
    bed.exec("tc", "class", "change", "dev", "up0", "parent", "7368:1", "classid", f"7368:{A & 0xFFFF:x}",
             "htb", "rate", "1mbit", "ceil", "2mbit")
    assert wait_for(lambda: classes(bed)[A]["rate"] == 40 * 10**9 // 8, 30)
    daemon.send_signal(signal.SIGTERM)
    out, _ = daemon.communicate(timeout=15)
    assert daemon.returncode == 0, out
    assert "Traceback" not in out and '"level": "error"' not in out, out[-2000:]


@pytest.mark.parametrize("missing,effect", [
    ("BPF", "no BPF classifier: interfaces and marks are not matched, addresses are (u32)"),
])
def test_what_each_capability_is_for(bed, tmp_path, missing, effect):
    caps = [c for c in granted() if c != missing]
    cfg = tmp_path / "t.yaml"
    cfg.write_text(CFG)
    r = bed.exec(*setpriv(caps), PY, "-m", "shaperd", "apply", "--config", str(cfg), check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    assert A in classes(bed)  # NET_ADMIN alone builds the tree
    has_bpf = "shpd" in bpf_filters(bed)
    assert not has_bpf, (effect, bpf_filters(bed))


def test_without_net_admin_nothing_is_written(bed, tmp_path):
    caps = [c for c in granted() if c != "NET_ADMIN"]
    cfg = tmp_path / "t.yaml"
    cfg.write_text(CFG)
    r = bed.exec(*setpriv(caps), PY, "-m", "shaperd", "apply", "--config", str(cfg), check=False)
    assert r.returncode != 0
    assert "Operation not permitted" in r.stdout + r.stderr
    assert not classes(bed)
    assert "htb" not in bed.exec("tc", "qdisc", "show", "dev", "up0").stdout


def test_without_net_admin_the_refusal_is_one_typed_line(bed, tmp_path):
    caps = [c for c in granted() if c != "NET_ADMIN"]
    cfg = tmp_path / "t.yaml"
    cfg.write_text(CFG)
    r = bed.exec(*setpriv(caps), PY, "-m", "shaperd", "apply", "--config", str(cfg), check=False)
    assert "Traceback" not in r.stderr, r.stderr[-1500:]
