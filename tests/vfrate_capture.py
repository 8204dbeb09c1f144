"""Re-record the VF-rate fixtures from iproute2 and this kernel (root, after scripts/setup):

    .venv/bin/python -m tests.vfrate_capture tests/unit/fixtures/vfrate

In a namespace it creates (removed at the end, also on failure), on a veth:
``strace -f -e trace=sendmsg,sendto -e write=all -e read=all -xx ip link set
dev vfa vf N min_tx_rate A max_tx_rate B`` for each of SETTINGS (the command
fails, the kernel has no VF rates on a veth; the request bytes and the error
reply are what is kept), and ``ip -d link show dev vfa`` (a GETLINK asking
for VF info, and a reply without IFLA_VFINFO_LIST). Every command runs with
a deadline in its own process group (shaperd_bed.netns.run).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from shaperd_bed import netns

NS = f"vfcap-{os.getpid()}"
DEV = "vfa"
# (fixture name, vf, min_tx_rate, max_tx_rate): Mbit/s, as ip-link(8) takes them.
SETTINGS = (("set_vf0_min100_max1000", 0, 100, 1000), ("set_vf3_min0_max25000", 3, 0, 25000),
            ("set_vf1_min2500_max0", 1, 2500, 0))
STRACE = ["strace", "-f", "-e", "trace=sendmsg,sendto,recvmsg", "-e", "write=all", "-e", "read=all", "-xx"]


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with netns.Namespaces(stop_grace_s=0) as nets:
        nets.add(NS)
        netns.run(["ip", "-n", NS, "link", "add", DEV, "type", "veth", "peer", "name", "vfb"])
        for name, vf, lo, hi in SETTINGS:
            argv = ["ip", "link", "set", "dev", DEV, "vf", str(vf), "min_tx_rate", str(lo), "max_tx_rate", str(hi)]
            r = netns.run(STRACE + argv, NS, check=False)
            (out / f"{name}.strace").write_text(f"# {' '.join(argv)} (exit {r.returncode})\n" + r.stderr)
        r = netns.run(STRACE + ["ip", "-d", "link", "show", "dev", DEV], NS)
        (out / "show_veth.strace").write_text(f"# ip -d link show dev {DEV}\n" + r.stderr)
    print(f"recorded {len(SETTINGS) + 1} files into {out}")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "tests/unit/fixtures/vfrate"))
