"""The systemd tier: the installed unit booted once under a real systemd (systemd-nspawn, Debian 12).

One session fixture builds the tree and boots it once (tests/systemd/boot.py); every test
reads what the container's collector recorded (container/collect.py). Without root the tier is
skipped with a reason; as root a missing debootstrap or systemd-nspawn is a failure (scripts/setup
installs them), so CI cannot skip it silently. The tree and the session's bpffs are removed at the
end, whatever happened.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from . import boot


@dataclass(frozen=True)
class Booted:
    results: dict
    caps_outside: dict | None
    journal: list[str]
    console: str
    timings: dict

    def step(self, name: str) -> dict:
        s = self.results["steps"].get(name)
        assert s is not None, f"the collector recorded no step {name!r}; console:\n{self.console[-3000:]}"
        assert s["ok"], f"step {name} failed in the container: {s['error']}\n{s.get('trace', '')}"
        return s

    def logs(self, msg: str) -> list[dict]:
        out = []
        for line in self.journal:
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            if isinstance(doc, dict) and doc.get("event") == msg:
                out.append(doc)
        return out


@pytest.fixture(scope="session")
def booted() -> Booted:
    if os.geteuid() != 0:
        pytest.skip("the systemd tier debootstraps a tree and boots it with systemd-nspawn: run the tests as root")
    try:
        boot.check_tools()
    except boot.SetupError as e:
        pytest.fail(f"systemd tier cannot run: {e}", pytrace=False)
    tree = boot.Tree()
    try:
        try:
            tree.build(boot.ROOT / "systemd" / "shaperd.service")
        except boot.SetupError as e:
            pytest.fail(f"systemd tier: building the tree failed: {e}", pytrace=False)
        b = tree.boot()
        print(f"\nsystemd tier: {tree.timings} (rc {b.rc})")
        res_file = tree.out / "results.json"
        if not res_file.exists():
            pytest.fail(f"the container recorded nothing (rc {b.rc} after {b.seconds:.0f} s; None = killed at the "
                        f"{boot.BOOT_DEADLINE_S:.0f} s deadline). Console:\n{b.console[-4000:]}", pytrace=False)
        caps = tree.out / "caps-outside.json"
        journal = tree.out / "journal.txt"
        yield Booted(json.loads(res_file.read_text()),
                     json.loads(caps.read_text()) if caps.exists() and caps.stat().st_size else None,
                     journal.read_text().splitlines() if journal.exists() else [], b.console, dict(tree.timings))
    finally:
        tree.remove()
