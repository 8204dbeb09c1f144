"""Re-record the smpquery fixtures from OpenSM on ibsim (root, with scripts/setup's packages installed):

    sudo .venv/bin/python -m tests.ibsim_capture tests/unit/fixtures/smpquery

Renders tenants.yaml in that directory with ``--max-vls 8 --max-vls ca=4``,
runs one OpenSM sweep with it on the test fabric (tests/ibsim.py), and saves
smpquery's stdout for an HCA port and switch ports, by LID and by direct
route to the HCA itself (what the node-side check runs), next to the options
file OpenSM was given. Every process is killed by group when it ends.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from shaperd.core import config
from shaperd.rdma import opensm
from shaperd.rdma.plan import plan
from shaperd.core.inventory import Inventory
from shaperd.core.tenancy import tenancy

from .ibsim import Fabric, wait_for

MAX_VLS = {"default": 8, "ca": 4}


def main(out: Path) -> None:
    out = out.resolve()  # opensm runs in the fabric's directory
    cfg = config.load_file(out / "tenants.yaml")
    inv = Inventory()
    text = opensm.render(cfg, plan(cfg, inv, tenancy(cfg, inv)), MAX_VLS).text()
    (out / "opensm.conf").write_text(text)
    with tempfile.TemporaryDirectory() as tmp:
        fabric = Fabric(Path(tmp))
        try:
            fabric.start()
            osm = fabric.opensm_once(out / "opensm.conf")
            assert "Loading Cached Option:qos = TRUE" in osm.stdout, osm.stdout  # else OpenSM used its defaults
            ports = wait_for(lambda: (ps := fabric.ports()) and all(p.lid for p in ps) and ps, 60, "LIDs")
            hca = next(p for p in ports if p.kind == "CA" and p.name == "Hca1")
            sw = next(p for p in ports if p.kind == "SW" and p.name == "Switch1" and p.peer == "Switch2")
            captures = {
                "sl2vl_ca.txt": fabric.smpquery("sl2vl", str(hca.lid), "1"),
                "vlarb_ca.txt": fabric.smpquery("vlarb", str(hca.lid), "1"),
                "sl2vl_switch.txt": fabric.smpquery("sl2vl", str(sw.lid), str(sw.port)),
                "vlarb_switch.txt": fabric.smpquery("vlarb", str(sw.lid), str(sw.port)),
                "vlarb_switch_port0.txt": fabric.smpquery("vlarb", str(sw.lid), "0"),
                "sl2vl_self.txt": fabric.smpquery("-C", "ibsim0", "-P", "1", "-D", "sl2vl", "0", sim_host="Hca1"),
                "vlarb_self.txt": fabric.smpquery("-C", "ibsim0", "-P", "1", "-D", "vlarb", "0", "1",
                                                  sim_host="Hca1"),
            }
        finally:
            fabric.close()
    for name, body in captures.items():
        (out / name).write_text(body)
        print(f"wrote {out / name}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent / "unit" / "fixtures" / "smpquery")
