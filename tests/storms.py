"""Config storms for the daemon's file watch: the fault generator of the storm test and benchmark.

Owns: a ConfigMap-style layout (``tenants.yaml -> ..data/tenants.yaml``,
``..data -> ..vN``) and a storm of rewrites of it: good and invalid files
written in place, truncated and half-written files (two writes, the file
visible in between), emptied files and atomic ``..data`` symlink swaps, as
kubelet does. The pace (N writes in D seconds) makes load, it synchronises
nothing. Must not: start, wait for or judge the daemon (the test and the
benchmark do).
"""

from __future__ import annotations

import collections
import os
import random
import time
from pathlib import Path

KINDS = ("good", "invalid", "truncated", "half-written", "empty", "swap-good", "swap-invalid")


class ConfigMapDir:
    """The volume layout kubelet makes for a ConfigMap key."""

    def __init__(self, root: Path, text: str, key: str = "tenants.yaml"):
        self.root, self.key = root, key
        self.gen = 0
        root.mkdir(parents=True, exist_ok=True)
        first = self._new_version(text)
        (root / "..data").symlink_to(first.name)
        (root / key).symlink_to(f"..data/{key}")

    @property
    def path(self) -> Path:
        return self.root / self.key

    def _new_version(self, text: str) -> Path:
        self.gen += 1
        d = self.root / f"..v{self.gen}"
        d.mkdir()
        (d / self.key).write_text(text)
        return d

    def swap(self, text: str) -> None:
        """Atomic update: a new version directory, then rename a new symlink over ..data; the old
        version is removed afterwards, as kubelet does."""
        old = os.readlink(self.root / "..data")
        d = self._new_version(text)
        tmp = self.root / "..data_tmp"
        tmp.symlink_to(d.name)
        tmp.replace(self.root / "..data")
        (self.root / old / self.key).unlink()
        (self.root / old).rmdir()

    def write_in_place(self, text: str) -> None:
        with open(self.path, "w") as f:  # through the symlinks: truncate, then write
            f.write(text)

    def write_half(self, text: str) -> None:
        """The first half visible on its own (flushed), then the rest: a slow writer."""
        with open(self.path, "w") as f:
            f.write(text[: len(text) // 2])
            f.flush()
            os.fsync(f.fileno())
            f.write(text[len(text) // 2:])


def storm(cm: ConfigMapDir, good: list[str], invalid: list[str], n: int, duration_s: float,
          seed: int = 14, kinds: tuple[str, ...] = KINDS) -> collections.Counter:
    """*n* rewrites over *duration_s*, kinds drawn from *kinds*; returns how many of each were done."""
    rng = random.Random(seed)
    done: collections.Counter = collections.Counter()
    start = time.monotonic()
    for i in range(n):
        kind = rng.choice(kinds)
        g = rng.choice(good)
        if kind == "good":
            cm.write_in_place(g)
        elif kind == "invalid":
            cm.write_in_place(rng.choice(invalid))
        elif kind == "truncated":
            cm.write_in_place(g[: rng.randrange(1, len(g))])
        elif kind == "half-written":
            cm.write_half(g)
        elif kind == "empty":
            cm.write_in_place("")
        elif kind == "swap-good":
            cm.swap(g)
        else:
            cm.swap(rng.choice(invalid))
        done[kind] += 1
        pause = start + duration_s * (i + 1) / n - time.monotonic()
        if pause > 0:
            time.sleep(pause)  # pacing the load only
    return done
