"""`shaperd plan` output for every file in examples/ on a fixed inventory, byte for byte.

The fixtures in tests/unit/fixtures/plan/ were recorded from the planner
before the backend refactor (issue 8); a change to them is a change in what
shaperd enforces and must be deliberate. Re-record with
``python tests/unit/test_plan_golden.py --record``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from shaperd.core import config
from shaperd.core.protocol import PlanInput
from shaperd.backends.htb import plan as htb_plan
from shaperd.backends.htb.render import render
from shaperd.backends.marks import plan as marks_plan
from shaperd.core.inventory import Capabilities, CgroupRef, Inventory, Link, Pod
from shaperd.core.tenancy import tenancy

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).parent / "fixtures" / "plan"
INV = Inventory(
    links=(Link("lo", 1, speed_bps=None), Link("eth0", 2, speed_bps=100 * 10**9),
           Link("vetha1", 7, kind="veth"), Link("vethb1", 8, kind="veth")),
    default_route_devices=("eth0",),
    capabilities=Capabilities(bpf=True, leaf_kinds=frozenset({"bfifo"})),
    pods=(Pod("uid-a", "team-a", "a-0", (("training-tenant", "tenant-a"),), ("198.18.5.7",), host_ifindex=8,
              host_ifname="vethb1"),),
    cgroups=(CgroupRef("/sys/fs/cgroup/tenant-a.slice", 1, 4242),),
)
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))


def rendered(path: Path) -> str:
    cfg = config.load_file(str(path))
    ctx = PlanInput(cfg, INV, tenancy(cfg, INV))
    hp = htb_plan.plan(cfg, INV, ten=ctx.tenancy)
    mp = marks_plan.plan(cfg, INV, ctx.tenancy)
    warnings = ctx.tenancy.warnings + hp.warnings + mp.warnings
    return (render(hp, mp.marks) + "".join(f"# problem: {p}\n" for p in hp.problems)
            + "".join(f"# warning: {w}\n" for w in warnings))


def test_every_example_has_a_fixture():
    assert EXAMPLES and {p.stem for p in EXAMPLES} == {p.stem for p in FIXTURES.glob("*.txt")}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_plan_is_byte_identical(path):
    assert rendered(path) == (FIXTURES / f"{path.stem}.txt").read_text()


if __name__ == "__main__" and "--record" in sys.argv:
    for p in EXAMPLES:
        (FIXTURES / f"{p.stem}.txt").write_text(rendered(p))
