"""Probe, once at start, what this kernel's traffic control offers.

Runs in a throwaway network namespace so nothing on the node's own devices
is touched: creates a veth pair there and tries each qdisc and classifier
shaperd may use. The result decides between degrading with a warning and
failing with a message naming the missing feature.

The namespace has no name: a helper thread unshare(2)s into a new network
namespace of its own and probes from there. It lives only as long as that
thread and its sockets, so a process killed at any point (SIGKILL during
start-up included) leaves nothing behind. (It used to be a named namespace,
``shaperd-probe-PID`` under /run/netns, created and removed around the probe:
a kill between the two left it on the node, 2 times in 20 trials. Those
left by older versions are swept at start when their PID is dead.)

``read_only`` (``shaperd plan``, which must not write to the node): the same
tests in the same throwaway namespace, but nothing outside it is written:
no sweep of older versions' namespaces, and bpffs pins are checked
(bpf_pins.pinnable) instead of made and removed again.

Where bpf() fails, the probe also says why when it can tell (``Capabilities.bpf_refused``):
``bpf_refused_by_seccomp`` when the load fails with EPERM although the process holds CAP_BPF or
CAP_SYS_ADMIN, a bpf() command no kernel has fails with EPERM too (the kernel itself would answer
EINVAL: the call never reached it), and /proc/self/status says ``Seccomp: 2`` (a filter is
installed). In a pod that filter is the container runtime's RuntimeDefault profile; under systemd,
the unit's SystemCallFilter=. ``classify_bpf_refusal`` is that decision, pure.
"""

from __future__ import annotations

import ctypes
import errno
import os
import socket
import threading
from dataclasses import dataclass
from typing import Callable
from pathlib import Path

from pyroute2.netlink.exceptions import NetlinkError

from shaperd.core import units
from shaperd.core.pids import pid_alive
from shaperd.core.inventory import Capabilities
from shaperd.core.roots import Roots
from shaperd.kernel import link, nlwriter
from shaperd.kernel import tc as _tc  # also registers the bfifo and fq codecs with pyroute2
from shaperd.kernel.tc import TC_H_ROOT


@dataclass(frozen=True)
class ProgramChecks:
    """The backends' own eBPF programs, which only they can build, tried by the probe.

    Supplied from above (shaperd/engine/probe.py gathers them from the backends): the kernel layer
    never imports a backend. A check that is None was not supplied, and what it would decide is
    reported unavailable, with that reason.

    - ``classifier_attach(w, ifindex) -> (ok, why)``: the map classifier attaches on a probe device (``w``: the
      probe's kernel/tc.TcWriter; only its ``nlm_request_batch`` is used);
    - ``classifier_load(bpffs_root, read_only) -> (how, why)``: its maps made, the program loaded and got
      back ("pins", "id" or "" when not); ``read_only``: pin nothing, check what pinning would need;
    - ``stamper_load(bpffs_root, read_only) -> (ok, why)``: edt's stamper loads and comes back through pins.
    """

    classifier_attach: Callable | None = None
    classifier_load: Callable | None = None
    stamper_load: Callable | None = None

    def attach(self, w, ifindex: int) -> tuple[bool, str]:
        return self.classifier_attach(w, ifindex) if self.classifier_attach else (False, _NOT_SUPPLIED)

    def load(self, bpffs_root: str | None, read_only: bool = False) -> tuple[str, str]:
        return self.classifier_load(bpffs_root, read_only) if self.classifier_load else ("", _NOT_SUPPLIED)

    def stamper(self, bpffs_root: str | None, read_only: bool = False) -> tuple[bool, str]:
        return self.stamper_load(bpffs_root, read_only) if self.stamper_load else (False, _NOT_SUPPLIED)


_NOT_SUPPLIED = "no backend supplied this check"
NO_CHECKS = ProgramChecks()

CLONE_NEWNET = 0x40000000
MNT_DETACH = 2
LEGACY_PREFIX = "shaperd-probe-"
PROBE_TIMEOUT_S = 30.0
_libc = ctypes.CDLL(None, use_errno=True)

# Capabilities.bpf_refused's reason: a seccomp filter refuses bpf() although the process may call it.
BPF_REFUSED_BY_SECCOMP = "bpf_refused_by_seccomp"
_CAP_SYS_ADMIN, _CAP_BPF = 21, 39  # capability bit numbers (linux/capability.h)
_SECCOMP_MODE_FILTER = "2"  # /proc/PID/status "Seccomp:" (0 off, 1 strict, 2 filter)
_BPF_NO_SUCH_CMD = 0x7FFF  # a bpf() command no kernel has: the kernel answers EINVAL, a seccomp filter EPERM
_SECCOMP_NOTE = ("bpf() refused by a seccomp filter although CAP_BPF or CAP_SYS_ADMIN is held "
                 f"({BPF_REFUSED_BY_SECCOMP})")


def classify_bpf_refusal(load_errno: int, bare_errno: int, status_text: str) -> str:
    """Why bpf() is refused, pure: ``BPF_REFUSED_BY_SECCOMP`` or "" (not refused, or not by seccomp).

    ``load_errno``: the errno of loading a do-nothing SCHED_CLS program; ``bare_errno``: of a bpf() command no
    kernel has (the kernel answers EINVAL to a capable caller, so EPERM there was said before the kernel saw the
    call); ``status_text``: /proc/self/status (CapEff, Seccomp)."""
    if load_errno != errno.EPERM or bare_errno != errno.EPERM:
        return ""
    return BPF_REFUSED_BY_SECCOMP if _filtered_and_capable(status_text) else ""


def _filtered_and_capable(status_text: str) -> bool:
    """/proc/PID/status says a seccomp filter is installed and CAP_BPF or CAP_SYS_ADMIN is effective."""
    fields = dict(line.split(":", 1) for line in status_text.splitlines() if ":" in line)
    try:
        capeff = int(fields.get("CapEff", "").strip(), 16)
    except ValueError:
        return False
    # Without either capability the kernel itself refuses: the load's own message says which is missing.
    return fields.get("Seccomp", "").strip() == _SECCOMP_MODE_FILTER and \
        bool(capeff & ((1 << _CAP_BPF) | (1 << _CAP_SYS_ADMIN)))


def _bpf_errnos() -> tuple[int, int]:
    """(errno of loading a do-nothing SCHED_CLS program, errno of a bpf() command no kernel has); 0: it worked."""
    from shaperd.kernel import bpf

    try:
        nr, syscall = bpf._syscall()
    except bpf.BpfError:
        return 0, 0  # no bpf() on this architecture: nothing refused it
    fd, load = bpf._prog_load(bpf.mov32_imm(0, 0) + bpf.exit_(), "shpd_probe", None)
    if fd >= 0:
        os.close(fd)
        return 0, 0
    r = syscall(ctypes.c_long(nr), ctypes.c_int(_BPF_NO_SUCH_CMD), ctypes.c_void_p(0), ctypes.c_uint(0))
    if r >= 0:  # no kernel answers this; should one, it is not ours to keep
        os.close(r)
        return load, 0
    return load, ctypes.get_errno()


def bpf_refusal(procfs_root: str = "/proc", errnos: Callable[[], tuple[int, int]] = _bpf_errnos) -> str:
    """``classify_bpf_refusal`` on this process: ``procfs_root``/self/status, then (only where it shows a filter
    and the capability) its bpf() errnos."""
    try:
        with open(os.path.join(procfs_root, "self", "status")) as f:
            status = f.read()
    except OSError:
        return ""
    if not _filtered_and_capable(status):
        return ""
    load, bare = errnos()
    return classify_bpf_refusal(load, bare, status)


def _bpf_verdict(procfs_root: str) -> tuple[bool, str, str]:
    """(bpf ok, why not, Capabilities.bpf_refused): bpf.bpf_supported, with the cause where it is seccomp."""
    from shaperd.kernel import bpf

    ok, why = bpf.bpf_supported()
    if ok:
        return ok, why, ""
    refused = bpf_refusal(procfs_root)
    return ok, (f"{_SECCOMP_NOTE}: {why}" if refused else why), refused


def default_qdisc(procfs_root: str = "/proc") -> str | None:
    """net.core.default_qdisc: the kernel instantiates it on every new device, so it is built in or loadable."""
    try:
        with open(os.path.join(procfs_root, "sys", "net", "core", "default_qdisc")) as f:
            return f.read().strip() or None
    except OSError:
        return None


def probe_capabilities(procfs_root: str = "/proc", run_root: str = "/run", bpffs_root: str | None = None,
                       roots: Roots | None = None, checks: ProgramChecks = NO_CHECKS,
                       read_only: bool = False) -> Capabilities:
    """``bpffs_root``: where the map classifier's pins go (None: by-id adoption only; the CLI passes
    --bpffs-root, default /sys/fs/bpf). ``roots``: where the kernel's evidence files are read when no
    probe namespace can be made (default: /proc = ``procfs_root``, /sys, /lib/modules, /boot). ``checks``: the
    backends' programs to try (shaperd/engine/probe.py passes them; without them no program is tried).
    ``read_only``: write nothing outside the probe's own namespace (module docstring)."""
    roots = roots or Roots(proc=Path(procfs_root))
    procfs_root = str(roots.proc)
    if not read_only:
        sweep_stale(Path(run_root) / "netns")
    box: dict = {}
    t = threading.Thread(target=_in_own_netns, args=(box, bpffs_root, checks, read_only), name="shaperd-probe",
                         daemon=True)
    t.start()
    t.join(PROBE_TIMEOUT_S)
    if t.is_alive():
        return _assumed(f"capability probe gave no answer within {PROBE_TIMEOUT_S:g} s", procfs_root, bpffs_root,
                        roots, checks, read_only)
    if "error" in box:
        e = box["error"]
        return _assumed(f"capability probe skipped ({getattr(e, 'strerror', None) or e})", procfs_root, bpffs_root,
                        roots, checks, read_only)
    return box["caps"]


def _assumed(why: str, procfs_root: str, bpffs_root: str | None = None, roots: Roots | None = None,
             checks: ProgramChecks = NO_CHECKS, read_only: bool = False) -> Capabilities:
    """No throwaway namespace (no CAP_SYS_ADMIN: the DaemonSet and the systemd unit drop it, or no netns
    support): assume the common kernel set and say so. Loading a do-nothing SCHED_CLS program touches no
    device, so cls_bpf is still tested here rather than assumed missing. What edt needs (sch_fq, mq) is
    read from the kernel's own files instead (kernel/qdisc_kinds.py): absent is not offered, unknown is
    offered and verified at apply (backends/edt/refusals.py)."""
    from shaperd.kernel import qdisc_kinds

    roots = roots or Roots(proc=Path(procfs_root))
    kinds = _asked_where_unknown(qdisc_kinds.evidence_all(roots))
    bpf_ok, bpf_why, refused = _bpf_verdict(procfs_root)
    if bpf_ok and kinds["cls_bpf"].state == qdisc_kinds.ABSENT:  # programs load, but nothing can attach them
        bpf_ok, bpf_why = False, str(kinds["cls_bpf"])
    # The map classifier: its maps made, its program loaded and got back, not attached (no probe device).
    how, maps_why = checks.load(bpffs_root, read_only) if bpf_ok else ("", "cls_bpf unavailable")
    # fq_codel leaves when the node's default qdisc is fq_codel (systemd's default): it exists there.
    leaf = {"bfifo"} | ({"fq_codel"} if default_qdisc(procfs_root) == "fq_codel" else set())
    notes = [f"{why}; assuming htb, u32, {', '.join(sorted(leaf))}"]
    if not bpf_ok:
        notes.append(f"cls_bpf unavailable ({bpf_why}): match.interfaces cannot be enforced")
    maps_ok, adopt = _classifier_note(how, maps_why, notes)
    for m in ("sch_htb", "cls_u32"):
        if kinds[m].state == qdisc_kinds.ABSENT:
            notes.append(f"kernel evidence: {kinds[m]} (assumed anyway: writes needing it fail, naming it)")
    stamper = _stamper_adopt(bpf_ok, bpffs_root, notes, checks, read_only)
    fq, mq = _edt_assumed(bpf_ok, stamper, notes, kinds)
    return Capabilities(htb=True, u32=True, bpf=bpf_ok, bpf_maps=maps_ok, bpf_adopt=adopt,
                        bpf_pin_root=(bpffs_root or "") if adopt == "pins" else "", leaf_kinds=frozenset(leaf),
                        notes=tuple(notes), fq=fq, mq=mq,
                        kinds=tuple((e.module, e.state, e.evidence) for e in kinds.values()),
                        edt_pin_root=(bpffs_root or "") if stamper == "pins" else "", bpf_refused=refused)


def _asked_where_unknown(kinds: dict) -> dict:
    """sch_fq's evidence, where the kernel's files say nothing, from the kernel itself: a request on lo that
    it must refuse either way (kernel/kind_ask.py, CAP_NET_ADMIN, changes nothing). No answer keeps
    "unknown" (verified at apply)."""
    from shaperd.kernel import kind_ask, qdisc_kinds

    ev = kinds.get("sch_fq")
    if ev is None or ev.state != qdisc_kinds.UNKNOWN:
        return kinds
    got = kind_ask.ask("fq")
    if got.state == kind_ask.NO_ANSWER:
        return {**kinds, "sch_fq": qdisc_kinds.KindEvidence("sch_fq", qdisc_kinds.UNKNOWN,
                                                             f"{ev.evidence}; asking the kernel: {got.detail}")}
    state = qdisc_kinds.PRESENT if got.state == kind_ask.PRESENT else qdisc_kinds.ABSENT
    return {**kinds, "sch_fq": qdisc_kinds.KindEvidence("sch_fq", state, f"{got.detail} (the kernel's files: "
                                                         f"{ev.evidence})")}


def _stamper_adopt(bpf_ok: bool, bpffs_root: str | None, notes: list[str], checks: ProgramChecks,
                   read_only: bool = False) -> str:
    """"pins" where the edt stamper itself loads and comes back through bpffs pins (its own program: the
    map classifier's verdict says nothing about it; on Debian's 6.1 without CAP_PERFMON the verifier
    refuses the classifier but not necessarily the stamper), else ""."""
    if not bpf_ok:
        return ""
    ok, why = checks.stamper(bpffs_root, read_only)
    if not ok:
        notes.append(f"edt stamper: {why}")
    return "pins" if ok else ""


def _edt_assumed(bpf_ok: bool, adopt: str, notes: list[str], kinds: dict) -> tuple[bool, bool]:
    """(fq, mq) without a probe namespace. edt is offered only where its stamper's maps come back after a
    restart without CAP_SYS_ADMIN (bpffs pins) and the kernel's files do not say sch_fq, mq or cls_bpf is
    absent; a kind they cannot tell about (unknown) is verified when first applied on each device."""
    from shaperd.kernel.qdisc_kinds import ABSENT, UNKNOWN

    if not (bpf_ok and adopt == "pins"):
        notes.append("edt unavailable: without a probe namespace the stamper must load and its maps come back "
                     "through bpffs pins (by id needs CAP_SYS_ADMIN) (node.dataplane edt/auto fall back to htb)")
        return False, False
    absent = [str(kinds[m]) for m in ("sch_fq", "sch_mq", "cls_bpf") if kinds[m].state == ABSENT]
    if absent:
        notes.append(f"edt unavailable: {'; '.join(absent)} (node.dataplane edt/auto fall back to htb)")
        return kinds["sch_fq"].state != ABSENT, kinds["sch_mq"].state != ABSENT
    unknown = [str(kinds[m]) for m in ("sch_fq", "sch_mq") if kinds[m].state == UNKNOWN]
    if unknown:
        notes.append(f"edt: {'; '.join(unknown)}: offered and verified when first applied on each device "
                     "(a device whose kernel refuses the kind falls back to htb); stamper maps adopted through "
                     "bpffs pins")
    else:
        notes.append(f"edt: {kinds['sch_fq']}; {kinds['sch_mq']}; stamper maps adopted through bpffs pins")
    return True, True


def _classifier_note(how: str, why: str, notes: list[str]) -> tuple[bool, str]:
    """(bpf_maps, bpf_adopt) from probe_load's answer, honouring SHAPERD_CLASSIFIER=u32; notes say why."""
    if os.environ.get("SHAPERD_CLASSIFIER", "") == "u32" and how:
        notes.append("classifier: u32 path (SHAPERD_CLASSIFIER=u32)")
        return False, ""
    if not how:
        notes.append(f"eBPF map classifier unavailable ({why}): classifying with u32 filters")
        return False, ""
    notes.append(f"eBPF map classifier adopted after a restart {'through ' if how == 'pins' else ''}{why}")
    return True, how


def unshare_netns() -> None:
    """Move the calling thread (only it) into a new, unnamed network namespace (tests replace this)."""
    if _libc.unshare(CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def _in_own_netns(box: dict, bpffs_root: str | None = None, checks: ProgramChecks = NO_CHECKS,
                  read_only: bool = False) -> None:
    """On the helper thread: into a namespace of its own, then probe."""
    try:
        unshare_netns()
        box["caps"] = _probe(bpffs_root, checks, read_only)
    except Exception as e:  # noqa: BLE001 - reported as a degraded probe, never a crash at start
        box["error"] = e


def _probe(bpffs_root: str | None = None, checks: ProgramChecks = NO_CHECKS, read_only: bool = False) -> Capabilities:
    notes: list[str] = []
    # Created on this thread: its socket is in the unnamed namespace. shaperd's own bounded writer
    # (kernel/nlwriter.py: acked, deadlined), not pyroute2's IPRoute: that module alone is 4.6 MiB of a
    # long-lived daemon's RSS for a question asked once at start.
    with _tc.TcWriter(nlwriter.NetlinkWriter(nlwriter.open_rtnl_writer(None), "the probe namespace")) as w:
        w.nlm_request_batch([link.new_veth("p0", "p1")])
        idx = socket.if_nametoindex("p0")
        htb = _try(lambda: _put_qdisc(w, idx, 0x10000, TC_H_ROOT, "htb", _tc.htb_init(2)))
        if not htb:
            notes.append("sch_htb missing: shaperd cannot enforce anything on this kernel")
            return Capabilities(htb=False, u32=False, bpf=False, leaf_kinds=frozenset(), notes=tuple(notes))
        w.nlm_request_batch([_tc.msg(_tc.RTM_NEWTCLASS, _tc.F_PUT, idx, 0x10002, 0x10000, kind="htb",
                                     options=_PROBE_CLASS)])
        leaf = set()
        for kind, opts in (("fq_codel", None), ("bfifo", {"limit": 100000})):
            if _try(lambda: _put_qdisc(w, idx, 0x20000, 0x10002, kind, opts)):
                leaf.add(kind)
        u32 = _try(lambda: w.nlm_request_batch([_tc.msg(
            _tc.RTM_NEWTFILTER, _tc.F_ADD, idx, 0, 0x10000, _tc.info(1, 0x0800), "u32", _PROBE_U32)]))
        edt_fq, edt_mq = _edt_qdiscs(w)
        _off_ok, off_why = htb_offload(w, socket.if_nametoindex("q1"), "veth")
        if not _off_ok:
            notes.append(f"{off_why} (probe veth): HTB offload is decided per uplink (discovery/htb_offload.py "
                         "probes each device read-only; backends/htb/offload_plan.py decides)")
        bpf_ok, why, refused = _bpf_verdict("/proc")  # this process's own status: the probe runs on a real kernel
        attach_ok, maps_why = checks.attach(w, idx) if bpf_ok else (False, "cls_bpf unavailable")
    # Attaching works: now how a restarted agent gets the maps back (pins first, else by id). bpf()
    # objects and bpffs belong to no network namespace, so this thread's namespace does not matter.
    how, adopt_why = checks.load(bpffs_root, read_only) if attach_ok else ("", maps_why)
    if not bpf_ok:
        notes.append(f"cls_bpf unavailable ({why}): match.interfaces cannot be enforced")
    maps_ok, adopt = _classifier_note(how, adopt_why, notes)
    if "fq_codel" not in leaf:
        notes.append("fq_codel missing: leaf queues are bfifo sized in time at the class ceiling")
    if not edt_fq:
        notes.append("edt unavailable: sch_fq missing (node.dataplane edt/auto fall back to htb)")
    elif not edt_mq:
        notes.append("edt unavailable: mq missing (node.dataplane edt/auto fall back to htb)")
    return Capabilities(htb=True, u32=u32, bpf=bpf_ok, bpf_maps=maps_ok, bpf_adopt=adopt,
                        bpf_pin_root=(bpffs_root or "") if adopt == "pins" else "", leaf_kinds=frozenset(leaf),
                        notes=tuple(notes), fq=edt_fq, mq=edt_mq,
                        edt_pin_root=(bpffs_root or "") if adopt == "pins" else "", bpf_refused=refused)


# The probe's HTB class (1:2 at 1 Mbit/s, what `tc class add ... htb rate 1mbit` makes: buffer and cbuffer
# of 1600 bytes, quantum 0 = the kernel's rate2quantum) and its u32 filter (198.18.0.0/16 by source).
_PROBE_RATE_BPS = 1_000_000
_PROBE_CLASS = {"attrs": [["TCA_HTB_PARMS", {
    "rate___reserved": 1, "rate": _PROBE_RATE_BPS // 8, "ceil___reserved": 1, "ceil": _PROBE_RATE_BPS // 8,
    "buffer": units.xmit_ticks(1600, _PROBE_RATE_BPS), "cbuffer": units.xmit_ticks(1600, _PROBE_RATE_BPS),
    "quantum": 0, "prio": 0}]]}
_PROBE_U32 = {"attrs": [["TCA_U32_CLASSID", 0x10002],
                        ["TCA_U32_SEL", {"flags": 1, "keys": ["0xc6120000/0xffff0000+12"]}]]}


def _put_qdisc(w, ifindex: int, handle: int, parent: int, kind: str, options) -> None:
    w.nlm_request_batch([_tc.msg(_tc.RTM_NEWQDISC, _tc.F_PUT, ifindex, handle, parent, kind=kind, options=options)])


def sweep_stale(netns_dir: Path) -> list[str]:
    """Remove ``shaperd-probe-PID`` namespaces whose process is gone (left by older versions); their names."""
    removed = []
    try:
        names = [p.name for p in netns_dir.iterdir() if p.name.startswith(LEGACY_PREFIX)]
    except OSError:
        return removed
    for name in names:
        pid = name[len(LEGACY_PREFIX):]
        if not pid.isdigit() or pid_alive(int(pid)):
            continue
        path = netns_dir / name
        _libc.umount2(str(path).encode(), MNT_DETACH)  # fails (EINVAL) where it is no longer a mount: fine
        try:
            path.unlink()
            removed.append(name)
        except OSError:
            pass
    return removed


def htb_offload(w, ifindex: int, device: str) -> tuple[bool, str]:
    """Try ``htb offload`` as the root of ``device`` (a probe veth: never a node's device) through ``w``
    (anything with ``nlm_request_batch``: the probe's TcWriter). (ok, why not)."""
    msg = _tc.msg(_tc.RTM_NEWQDISC, _tc.F_PUT, ifindex, 0x10000, TC_H_ROOT, kind="htb", options=_tc.htb_init(2, True))
    try:
        w.nlm_request_batch([msg])
    except NetlinkError as e:
        return False, f"htb offload on {device}: {os.strerror(e.code)}"
    w.nlm_request_batch([_tc.msg(_tc.RTM_DELQDISC, _tc.F_DEL, ifindex, 0x10000, TC_H_ROOT)])
    return True, ""


def _edt_qdiscs(w) -> tuple[bool, bool]:
    """(sch_fq, mq) on a veth with 4 TX queues in the probe namespace: what the edt data plane needs."""
    w.nlm_request_batch([link.new_veth("q0", "q1", num_tx_queues=4)])
    idx = socket.if_nametoindex("q0")
    mq = _try(lambda: _put_qdisc(w, idx, 0x73650000, TC_H_ROOT, "mq", None))
    if mq:
        fq = _try(lambda: _put_qdisc(w, idx, 0x80010000, 0x73650001, "fq", None))
    else:
        fq = _try(lambda: _put_qdisc(w, idx, 0x73650000, TC_H_ROOT, "fq", None))
    return fq, mq


def _try(fn) -> bool:
    try:
        fn()
        return True
    except (NetlinkError, OSError):
        return False
