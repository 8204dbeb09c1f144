"""`shaperd plan` says what is so: as root it probes the kernel as diff and apply do (a probe that writes
nothing to the node), so it shows the edt plane where the kernel has it; without root it names the
capabilities it assumed; a backend the tenants file does not need (devlink on a node without it) says
nothing. No kernel here: the probe and the node are replaced, the planning is real."""

from __future__ import annotations

import os

import pytest
import structlog

from shaperd.backends.devlink.backend import DevlinkBackend
from shaperd.backends.edt.backend import EdtBackend
from shaperd.backends.htb.backend import HtbBackend
from shaperd.backends.marks.backend import MarksBackend
from shaperd.cli import main as cli
from shaperd.cli import node
from shaperd.core.inventory import Capabilities
from shaperd.core.roots import Roots
from shaperd.engine import reconciler as engine
from shaperd.kernel import devlink as nl
from shaperd.kernel import probe
from shaperd.kernel.rtnl_rows import LinkRow

from ..rdma_fixture import Node as RdmaNode

EDT_CFG = """node:
  interfaces: [eth0]
  capacity: 10Gbps
  dataplane: edt
tenants:
  - name: tenant-a
    bandwidthGuarantee: 4Gbps
    bandwidthLimit: 6Gbps
    priority: 100
    match: {cidrs: [198.18.1.0/24]}
"""
# What a root probe finds on a kernel with sch_fq and mq (the edt data plane's needs).
PROBED = Capabilities(htb=True, u32=True, bpf=True, bpf_maps=True, bpf_adopt="id", fq=True, mq=True,
                      leaf_kinds=frozenset({"bfifo", "fq_codel"}), notes=("probed here: a kernel with sch_fq",))


@pytest.fixture(autouse=True)
def _logging_as_it_was():
    """cli.main configures structlog onto this test's captured stderr; later tests must not log into it."""
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)


class Reader:
    """Enough of RtnlReader for discovery: one uplink with 4 TX queues, no routes."""

    def links(self):
        return [LinkRow(1, "lo", "", 65536, True), LinkRow(2, "eth0", "", 1500, True, tx_queues=4)]

    def routes(self, family):
        return []


@pytest.fixture
def node_here(monkeypatch, tmp_path):
    """The node cli/node.reconciler opens: this reader, the htb, edt and marks backends, empty roots.
    Returns the capabilities each open_node got."""
    opened: list[Capabilities] = []
    roots = Roots.of(sys=tmp_path / "sys", proc=tmp_path / "proc", run=tmp_path / "run")

    def open_node(caps, **kw):
        opened.append(caps)
        return engine.Reconciler(Reader(), [HtbBackend(None), EdtBackend(None), MarksBackend(None)], caps,
                                 roots=roots, cgroup_root=None)

    monkeypatch.setattr(engine, "open_node", open_node)
    return opened


@pytest.fixture
def cfg(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text(EDT_CFG)
    return str(path)


def test_plan_as_root_probes_as_diff_does_writing_nothing_and_shows_the_edt_plane(monkeypatch, capsys, cfg,
                                                                                   node_here):
    asked = []

    def probe_capabilities(**kw):
        asked.append(kw)
        return PROBED

    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(probe, "probe_capabilities", probe_capabilities)
    assert cli.main(["plan", "-c", cfg]) == 0
    out = capsys.readouterr().out
    assert [kw["read_only"] for kw in asked] == [True]  # probed, and told to write nothing to the node
    assert node_here == [PROBED]
    assert "not root" not in out and "# note: probed here: a kernel with sch_fq" in out
    assert "# edt on eth0" in out and "tc qdisc replace dev eth0 root handle 7365: mq" in out, out
    assert "7368:" not in out  # eth0 is on edt: no HTB tree planned for it


def test_diff_probes_the_same_way_and_may_test_pins(monkeypatch, cfg, node_here):
    asked = []
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(probe, "probe_capabilities", lambda **kw: asked.append(kw) or PROBED)
    cli.main(["diff", "-c", cfg])  # the fake node cannot be read (no qdisc dump): only the probe matters here
    assert [kw["read_only"] for kw in asked] == [False] and node_here == [PROBED]


def test_plan_without_root_names_what_it_assumed_and_what_not(monkeypatch, capsys, cfg, node_here):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(probe, "probe_capabilities", lambda **kw: pytest.fail("no probe without root"))
    assert cli.main(["plan", "-c", cfg]) == 0
    out = capsys.readouterr().out
    (note,) = [line for line in out.splitlines() if line.startswith("# note:")]
    assert note == ("# note: not root, so capabilities not probed: assumed sch_htb, cls_u32, cls_bpf, bfifo leaves; "
                    "not assumed: the eBPF map classifier (u32 filters instead), fq_codel leaves, sch_fq and mq "
                    "(no edt data plane)")
    assert node_here[0].fq is False and "# edt on" not in out  # as assumed: eth0 falls back to htb
    assert "edt unavailable" in out and "7368:" in out


def test_the_assumed_note_follows_the_capabilities_it_describes():
    caps = node.assumed("why", Capabilities(htb=True, u32=False, bpf=False, bpf_maps=True, fq=True, mq=True,
                                            leaf_kinds=frozenset({"fq_codel", "bfifo"})))
    assert caps.notes == ("why: assumed sch_htb, bfifo leaves, fq_codel leaves",)
    assert node.assumed("x").notes[0].startswith("x: assumed sch_htb, cls_u32, cls_bpf, bfifo leaves; not assumed")


# -- a backend nothing needs is silent ---------------------------------------------------------------------

class NoDevlinkFamily:
    """The devlink socket of a kernel without the devlink family (what most nodes without switchdev have)."""

    def family(self):
        raise nl.DevlinkAbsent("resolve", "generic netlink family devlink", "the node",
                               "the kernel has no devlink family (no devlink device, no rate group can exist here)")

    def close(self):
        pass


@pytest.fixture
def no_devlink(monkeypatch, tmp_path):
    """The node: eth0, the RDMA fixture's sysfs (mlx5_0 with VFs mlx5_2/3 at 0000:3b:00.2/3), no devlink."""
    roots = Roots.of(sys=str(RdmaNode(tmp_path / "node").build().sys), proc=tmp_path / "proc", run=tmp_path / "run")

    def open_node(caps, **kw):
        return engine.Reconciler(Reader(), [HtbBackend(None), DevlinkBackend(NoDevlinkFamily)], caps, roots=roots,
                                 cgroup_root=None)

    monkeypatch.setattr(engine, "open_node", open_node)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)


TENANT = """node: {interfaces: [eth0], capacity: 10Gbps}
tenants:
  - name: tenant-a
    bandwidthGuarantee: 4Gbps
    priority: 100
    match: {cidrs: [198.18.1.0/24]}
"""


@pytest.mark.parametrize("argv", [["plan"], ["plan", "-o", "json"]], ids=["text", "json"])
def test_no_devlink_word_where_no_tenant_holds_a_vf(no_devlink, capsys, tmp_path, argv):
    cfg = tmp_path / "t.yaml"
    cfg.write_text(TENANT)
    assert cli.main(argv + ["-c", str(cfg)]) == 0
    out, err = capsys.readouterr()  # (log lines, were there any, would be in err)
    assert "tenant-a" in out  # the plan is there
    assert "devlink" not in out + err


def test_a_tenant_holding_a_vf_is_told_devlink_is_missing(no_devlink, capsys, tmp_path):
    cfg = tmp_path / "t.yaml"
    cfg.write_text(TENANT + '    rdma: {devices: ["0000:3b:00.2"]}\n')
    assert cli.main(["plan", "-c", str(cfg)]) == 0
    out = capsys.readouterr().out
    assert ("# warning: devlink backend disabled: devlink rate groups: the kernel has no devlink family (no devlink "
            "device, no rate group can exist here)") in out.splitlines(), out


# -- log lines: from the daemons, or when asked ------------------------------------------------------------

@pytest.fixture
def handlers_that_log(monkeypatch):
    """plan's, run's and webhook's handlers replaced by one that logs a warning and returns 0 (the parser is
    built per main)."""
    from shaperd import webhook
    from shaperd.cli import reconcile, run
    from shaperd.core import log

    def logs(args):
        log.get("shaperd.test").warning("something to say", command=args.cmd)
        return 0

    monkeypatch.setattr(reconcile, "cmd_plan", logs)
    monkeypatch.setattr(run, "cmd_run", logs)
    monkeypatch.setattr(webhook, "main", logs)


@pytest.mark.parametrize("argv,lines", [
    (["plan"], 0),  # a one-shot command, not asked: no log line at all
    (["--log-json", "plan"], 1),
    (["--log-level", "warning", "plan"], 1),
    (["--log-level", "error", "plan"], 0),  # asked, but for errors only
    (["run"], 1),  # the daemons log unasked
    (["webhook"], 1),
])
def test_log_lines_come_from_the_daemon_or_when_asked(handlers_that_log, capsys, argv, lines):
    assert cli.main(argv) == 0
    err = capsys.readouterr().err.splitlines()
    assert len(err) == lines, err
    for line in err:  # stderr is not a terminal here: JSON lines
        assert '"event": "something to say"' in line and '"level": "warning"' in line
