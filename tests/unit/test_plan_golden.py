"""`shaperd plan` for every file in examples/, byte for byte, on a fixed node.

The test runs the real entry point (``shaperd.cli.main.main``, in-process,
stdout captured) with the node's filesystem roots pointed at a fixture tree
(``--sysfs-root`` and friends) and its netlink sockets at a fake kernel
(tests/fake_netlink.py) that knows the node's links and default route. No
root, nothing asked of the host's kernel; ``os.geteuid`` says "not root",
so plan assumes the common kernel set and says so, whoever runs the suite.

The node: ``lo``; ``eth0`` (a 100 Gbit/s NIC per its sysfs speed, the
default route's device); the host ends of two pod veths, ``vetha1`` and
``vethb1``; one cgroup, ``/sys/fs/cgroup/tenant-a.slice``, under the fixture's
cgroup2 mount. A cgroup's id is its directory's inode, which a fixture tree
cannot choose: discovery really finds it, and its id is then pinned to 4242
so the classifier (whose name hashes the id) stays the same from run to run.
``plan`` has no pods: pods come from the daemon's Kubernetes watcher only;
the planner's pod marks are checked below on an inventory that holds one.

The files in tests/unit/fixtures/plan/ are what ``shaperd plan`` printed; a
change to them is a change in what shaperd enforces and must be deliberate.
Re-record them from the repository root with:

    .venv/bin/python -m tests.unit.test_plan_golden --record
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import sys
from pathlib import Path

import pytest
import structlog

from shaperd.backends.htb import plan as htb_plan
from shaperd.backends.htb.render import render
from shaperd.backends.marks import plan as marks_plan
from shaperd.cli import main as cli
from shaperd.core import config
from shaperd.core.inventory import Capabilities, Inventory, Link, Pod
from shaperd.core.protocol import PlanInput
from shaperd.core.tenancy import tenancy
from shaperd.discovery import cgroups

from ..fake_netlink import FakeKernel, FakeLink, FakeRoute

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).parent / "fixtures" / "plan"
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
CGROUP_ID = 4242
NODE = dict(
    links=(FakeLink("lo", 1), FakeLink("eth0", 2, tx_queues=8), FakeLink("vetha1", 7, kind="veth"),
           FakeLink("vethb1", 8, kind="veth")),
    routes=(FakeRoute(oif=2, gateway="198.18.0.254"),),
)


def node_tree(top: Path) -> dict[str, Path]:
    """The fixture roots: eth0's speed, a cgroup2 mount with tenant-a.slice, empty run/kubelet/module trees."""
    roots = {n: top / n for n in ("sys", "proc", "run", "kubelet", "modules", "boot")}
    for p in roots.values():
        p.mkdir(parents=True, exist_ok=True)
    (roots["sys"] / "class" / "net" / "eth0").mkdir(parents=True, exist_ok=True)
    (roots["sys"] / "class" / "net" / "eth0" / "speed").write_text("100000\n")
    (roots["sys"] / "fs" / "cgroup" / "tenant-a.slice").mkdir(parents=True, exist_ok=True)
    (roots["proc"] / "self").mkdir(exist_ok=True)
    (roots["proc"] / "self" / "mountinfo").write_text(
        "35 24 0:30 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw\n")
    return roots


def plan_argv(example: Path, roots: dict[str, Path]) -> list[str]:
    return ["plan", "--config", str(example), "--sysfs-root", str(roots["sys"]), "--procfs-root", str(roots["proc"]),
            "--run-root", str(roots["run"]), "--kubelet-root", str(roots["kubelet"]),
            "--modules-root", str(roots["modules"]), "--boot-root", str(roots["boot"]), "--bpffs-root", ""]


def pin_cgroup_ids(mp) -> None:
    real = cgroups.ref

    def ref(*a, **kw):
        r = real(*a, **kw)
        return None if r is None else dataclasses.replace(r, id=CGROUP_ID)

    mp.setattr(cgroups, "ref", ref)


def shaperd_plan(example: Path, top: Path, mp) -> tuple[int, str, FakeKernel]:
    """Run ``shaperd plan`` on ``example``: (exit code, stdout, the fake kernel it asked). ``mp``: monkeypatch."""
    kernel = FakeKernel(**NODE).install(mp)
    pin_cgroup_ids(mp)
    mp.setattr(os, "geteuid", lambda: 65534)  # wherever the CLI asks
    out = io.StringIO()
    saved = structlog.get_config()  # cli.main configures logging onto this process's stderr
    try:
        with contextlib.redirect_stdout(out):
            code = cli.main(plan_argv(example, node_tree(top)))
    finally:
        structlog.configure(**saved)
    return code, out.getvalue(), kernel


def test_every_example_has_a_fixture():
    assert EXAMPLES and {p.stem for p in EXAMPLES} == {p.stem for p in FIXTURES.glob("*.txt")}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_shaperd_plan_is_byte_identical(path, tmp_path, monkeypatch):
    code, out, kernel = shaperd_plan(path, tmp_path, monkeypatch)
    assert code == 0
    assert out == (FIXTURES / f"{path.stem}.txt").read_text()
    # It read the node's links and both route tables, and asked for nothing the fake could not answer.
    asked = {(r.protocol, r.type) for r in kernel.requests}
    assert {(0, 18), (0, 26)} <= asked and kernel.unanswered == []
    first = out.splitlines()[0]  # plan without root says which capabilities it assumed
    assert first.startswith("# note: not root") and "assumed" in first


def test_the_cgroup_of_the_tenants_file_is_found_under_the_sysfs_root(tmp_path, monkeypatch):
    """full.yaml names /sys/fs/cgroup/tenant-a.slice as the host sees it: plan finds it in the fixture tree."""
    _code, out, _ = shaperd_plan(ROOT / "examples" / "full.yaml", tmp_path, monkeypatch)
    assert f"cgroup level 1 id {CGROUP_ID} -> " in out and "[/sys/fs/cgroup/tenant-a.slice]" in out


def test_a_pods_mark_program_is_planned_and_listed():
    """What plan cannot show (it has no pods): the planner with one pod on vethb1, rendered as plan renders it."""
    inv = Inventory(
        links=(Link("lo", 1), Link("eth0", 2, speed_bps=100 * 10**9), Link("vetha1", 7, kind="veth"),
               Link("vethb1", 8, kind="veth")),
        default_route_devices=("eth0",), capabilities=Capabilities(bpf=True, leaf_kinds=frozenset({"bfifo"})),
        pods=(Pod("uid-a", "team-a", "a-0", (("training-tenant", "tenant-a"),), ("198.18.5.7",), host_ifindex=8,
                  host_ifname="vethb1"),))
    cfg = config.load_file(str(ROOT / "examples" / "source-design.yaml"))
    ctx = PlanInput(cfg, inv, tenancy(cfg, inv))
    hp, mp = htb_plan.plan(cfg, inv, ten=ctx.tenancy), marks_plan.plan(cfg, inv, ctx.tenancy)
    text = render(hp, mp.marks)
    assert ("# mark program shpdm_315e33466 on vethb1 ingress (clsact, prio 0x7368): mark 0xe/0x7f for tenant "
            "tenant-a [team-a/a-0]\n") in text
    assert "u32 match ip src 198.18.5.7/32 flowid 7368:9dc9\n" in text


def _record() -> int:
    import tempfile

    mp = pytest.MonkeyPatch()
    with tempfile.TemporaryDirectory(prefix="shaperd-golden-") as tmp, contextlib.ExitStack() as undo:
        undo.callback(mp.undo)
        for p in EXAMPLES:
            code, out, kernel = shaperd_plan(p, Path(tmp) / p.stem, mp)
            if code != 0 or kernel.unanswered:
                print(f"{p.name}: exit {code}, unanswered {kernel.unanswered}", file=sys.stderr)
                return 1
            (FIXTURES / f"{p.stem}.txt").write_text(out)
            print(f"recorded {FIXTURES / (p.stem + '.txt')}", file=sys.stderr)
    return 0


if __name__ == "__main__" and "--record" in sys.argv:
    sys.exit(_record())
