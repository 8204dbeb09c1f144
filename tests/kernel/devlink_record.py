"""Record what iproute2's ``devlink port function rate`` sends, on a kernel that has the devlink family.

This machine's kernel has no devlink generic netlink family, so ``devlink``
stops after CTRL_CMD_GETFAMILY ("Failed to connect to devlink Netlink") and
never sends a RATE_* request. Debian's 6.1 kernel (CONFIG_NET_DEVLINK=y)
has the family and no devlink device, so under QEMU the tool resolves the
family, sends its RATE_* request and the kernel refuses it (ENODEV): the
request bytes are what the unit tests compare with shaperd's encoder.

Host side (as root, after ``scripts/setup``), re-records the fixtures::

    .venv/bin/python -m tests.kernel.devlink_record tests/unit/fixtures/devlink

Guest side (run by the host side through tests/kernel/vm.py)::

    python -m tests.kernel.devlink_record --guest OUTDIR

A kernel WITHOUT the family (this machine's) is recorded on the host itself,
no VM: the tool's CTRL_CMD_GETFAMILY and the kernel's ENOENT answer, in
``family_absent.strace`` (the unit tests' "this kernel has no devlink")::

    .venv/bin/python -m tests.kernel.devlink_record --absent tests/unit/fixtures/devlink
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

STRACE = ["strace", "-f", "-e", "trace=socket,sendto,sendmsg,recvmsg", "-e", "write=all", "-e", "read=all", "-xx"]
DEV = "pci/0000:00:00.0"
# fixture name -> devlink arguments (after "devlink")
CAPTURES = {
    "rate_add": ["port", "function", "rate", "add", f"{DEV}/shpd_a", "tx_share", "10mbit", "tx_max", "100mbit"],
    "rate_add_share_only": ["port", "function", "rate", "add", f"{DEV}/shpd_b", "tx_share", "1gbit"],
    "rate_set_node": ["port", "function", "rate", "set", f"{DEV}/shpd_a", "tx_share", "20mbit", "tx_max",
                      "200mbit"],
    "rate_set_parent": ["port", "function", "rate", "set", f"{DEV}/1", "parent", "shpd_a"],
    "rate_set_noparent": ["port", "function", "rate", "set", f"{DEV}/1", "noparent"],
    "rate_del": ["port", "function", "rate", "del", f"{DEV}/shpd_a"],
    "rate_show": ["-j", "port", "function", "rate", "show"],
    "port_show": ["-j", "port", "show"],
}


def guest(outdir: Path) -> int:
    from .guest_probe import run  # one step in its own process group, killed by group id at its deadline

    out: dict = {"uname": os.uname().release, "steps": {}}
    for name, args in CAPTURES.items():
        out["steps"][name] = run(STRACE + ["devlink"] + args)
    try:
        from shaperd.kernel import devlink as dl

        out["shaperd"] = dl.probe_answer()
    except Exception as e:  # noqa: BLE001 - recorded for the host to judge
        out["shaperd"] = {"error": f"{type(e).__name__}: {e}"}
    (outdir / "result.json").write_text(json.dumps(out, indent=1))
    return 0


def record(dest: Path) -> int:
    from . import vm

    with tempfile.TemporaryDirectory(prefix="shaperd-vm-") as tmp:
        run = vm.boot([sys.executable, "-m", "tests.kernel.devlink_record", "--guest", tmp], [Path(tmp)])
        result = Path(tmp) / "result.json"
        if not result.exists():
            print(run.output[-4000:], file=sys.stderr)
            print(f"the guest wrote no result (rc {run.rc}, {run.seconds:.0f} s)", file=sys.stderr)
            return 1
        data = json.loads(result.read_text())
    dest.mkdir(parents=True, exist_ok=True)
    for name, step in data["steps"].items():
        (dest / f"{name}.strace").write_text(step["stderr"])
    meta = {"uname": data["uname"], "argv": {n: ["devlink"] + a for n, a in CAPTURES.items()},
            "rc": {n: s["rc"] for n, s in data["steps"].items()}, "shaperd": data.get("shaperd")}
    (dest / "recording.json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
    print(f"recorded {len(data['steps'])} captures into {dest} from kernel {data['uname']} in {run.seconds:.0f} s")
    return 0


def record_absent(dest: Path) -> int:
    """On this host (a kernel without the devlink family): what ``devlink`` asked and the kernel answered."""
    from .guest_probe import run

    step = run(STRACE + ["devlink", "-j", "port", "function", "rate", "show"])
    if "ENOENT" not in step["stderr"] or "nlctrl" not in step["stderr"]:
        print(step["stderr"][-4000:], file=sys.stderr)
        print("this kernel did not answer the devlink family lookup with ENOENT: record --absent on a kernel "
              "without the devlink family", file=sys.stderr)
        return 1
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "family_absent.strace").write_text(step["stderr"])
    meta_path = dest / "recording.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    meta["absent"] = {"uname": os.uname().release, "argv": step["argv"][len(STRACE):], "rc": step["rc"]}
    meta_path.write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
    print(f"recorded family_absent.strace into {dest} from kernel {os.uname().release}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--guest", action="store_true", help="run inside the guest: capture into DIR/result.json")
    ap.add_argument("--absent", action="store_true", help="on this host, a kernel without the devlink family: "
                    "record the family lookup's ENOENT into DIR/family_absent.strace")
    ap.add_argument("dir", type=Path)
    args = ap.parse_args(argv)
    if args.absent:
        return record_absent(args.dir)
    return guest(args.dir) if args.guest else record(args.dir)


if __name__ == "__main__":
    sys.exit(main())
