"""bench/pod_churn.py's daemon: ``churn_daemon.py FRAMES -- <shaperd args>``.

tracemalloc (FRAMES > 0), a stdin command thread ("base" / "snap PATH": RSS, and with tracemalloc the top
growth since "base" and the top traced files), then shaperd's CLI in the main thread. A script of its own so
that the daemon's memory is shaperd's: it imports nothing of the benchmark (the test bed, tests.routed_pods,
urllib, statistics), which used to be counted in the daemon's RSS when the benchmark ran itself as the child.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def daemon_child(argv: list[str]) -> int:
    """``argv``: FRAMES -- <shaperd args>."""
    import faulthandler
    import tracemalloc

    faulthandler.register(signal.SIGUSR1)  # kill -USR1 <pid>: every thread's stack into the log
    frames = int(argv[0])
    args = argv[argv.index("--") + 1:]
    # Import first: compiling modules under tracemalloc is very slow, and imports are not the churn.
    import importlib

    from shaperd.cli.main import main

    for mod in ("shaperd.daemon.service", "shaperd.engine.reconciler", "shaperd.discovery.kubernetes", "shaperd.kernel.events",
                "shaperd.kernel.bpf", "shaperd.kernel.rtnl", "shaperd.kernel.probe", "shaperd.report.metrics",
                "shaperd.report.http", "shaperd.report.sampler", "shaperd.discovery.kubernetes.transport",
                "shaperd.discovery.kubernetes.watchstream", "prometheus_client"):
        importlib.import_module(mod)

    if frames > 0:
        tracemalloc.start(frames)
    holder: dict = {}

    def snapshot():
        return tracemalloc.take_snapshot().filter_traces((
            tracemalloc.Filter(False, tracemalloc.__file__), tracemalloc.Filter(False, "<frozen importlib._bootstrap>"),
            tracemalloc.Filter(False, "<unknown>")))

    def commands():
        for line in sys.stdin:
            cmd, _, arg = line.strip().partition(" ")
            out: dict = {"rss": _self_rss()}
            if frames > 0:
                import gc

                gc.collect()
                cur, peak = tracemalloc.get_traced_memory()
                out.update(traced_current=cur, traced_peak=peak)
                if cmd == "base":
                    holder["base"] = snapshot()
                elif cmd == "snap":
                    snap = snapshot()
                    base = holder.get("base")
                    if base is not None:
                        stats = snap.compare_to(base, "traceback")
                        out["top_growth"] = [
                            {"size_diff": s.size_diff, "count_diff": s.count_diff, "size": s.size, "count": s.count,
                             "where": [f"{fr.filename.replace(str(ROOT) + '/', '')}:{fr.lineno}"
                                       for fr in s.traceback][:frames]}
                            for s in stats[:12]]
                        out["total_diff"] = sum(s.size_diff for s in stats)
                    # Where the traced memory is at the end (allocated since tracing started: after the imports).
                    out["top_size"] = [{"size": s.size, "count": s.count,
                                        "where": s.traceback[0].filename.replace(str(ROOT) + "/", "")}
                                       for s in snap.statistics("filename")[:12]]
            if arg:
                tmp = arg + ".tmp"
                with open(tmp, "w") as f:
                    json.dump(out, f)
                os.replace(tmp, arg)

    threading.Thread(target=commands, name="bench-tracemalloc", daemon=True).start()

    return main(args)


def _self_rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


if __name__ == "__main__":
    sys.exit(daemon_child(sys.argv[1:]))
