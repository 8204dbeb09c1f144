"""Runs INSIDE the booted container (system python3, stdlib only): records what tests/systemd reads.

shaperd-test-collect.service starts it after shaperd.service. Every step waits on a condition
with a deadline, records its outcome in /out/results.json (a failed step is recorded, not
raised), and whatever happens the container is powered off at the end, so a boot always returns.
Every command has a timeout and runs in its own process group, killed by its id at the deadline.
"""

import json
import os
import re
import signal
import subprocess
import time
import traceback

OUT = "/out"
TENANTS = "/etc/shaperd/traffic-shaping.yaml"
SHAPERD = "/opt/shaperd/bin/shaperd"
DEV = "sd0"
results: dict = {"steps": {}}


def run(argv, timeout_s=30.0):
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        return 124, out, err + f"\ntimed out after {timeout_s} s"
    return p.returncode, out, err


def show(*props):
    _, out, _ = run(["systemctl", "show", "shaperd", "-p", ",".join(props)])
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def wait_for(what, check, deadline_s, every_s=0.5):
    """check() until it returns something truthy or the deadline passes; returns (value, seconds)."""
    t0 = time.monotonic()
    while True:
        v = check()
        if v:
            return v, round(time.monotonic() - t0, 1)
        if time.monotonic() - t0 > deadline_s:
            raise TimeoutError(f"{what}: not within {deadline_s} s")
        time.sleep(every_s)


def step(name):
    def deco(fn):
        try:
            results["steps"][name] = {"ok": True, **(fn() or {})}
        except Exception as e:  # noqa: BLE001 - recorded for the test to name
            results["steps"][name] = {"ok": False, "error": f"{type(e).__name__}: {e}",
                                      "trace": traceback.format_exc()[-2000:]}
        save()
        return fn
    return deco


def save():
    with open(f"{OUT}/results.json.tmp", "w") as f:
        json.dump(results, f, indent=1, sort_keys=True)
    os.replace(f"{OUT}/results.json.tmp", f"{OUT}/results.json")


def tc_json(*what):
    argv = ["tc", "-j", *what, "show", "dev", DEV]
    rc, out, err = run(argv)
    if rc != 0:
        raise RuntimeError(f"{' '.join(argv)}: rc {rc}: {err.strip()}")
    try:
        return json.loads(out) if out.strip() else []
    except ValueError as e:
        raise RuntimeError(f"{' '.join(argv)}: not JSON ({e}): {out[:1500]!r}") from None


def tc_classes():
    """HTB classes as {"class", "classid", "rate", "ceil"} (rates as tc prints them, e.g. "300Mbit"). Parsed from
    the text: Debian 12's tc (iproute2 6.1) prints HTB classes as text even under -j."""
    argv = ["tc", "class", "show", "dev", DEV]
    rc, out, err = run(argv)
    if rc != 0:
        raise RuntimeError(f"{' '.join(argv)}: rc {rc}: {err.strip()}")
    rows = []
    for line in out.splitlines():
        w = line.split()
        if len(w) >= 3 and w[0] == "class":
            row = {"class": w[1], "classid": w[2]}
            for key in ("rate", "ceil", "parent", "prio"):
                if key in w[3:]:
                    row[key] = w[w.index(key, 3) + 1]
            rows.append(row)
    return rows


def tc_qdiscs():
    return tc_json("qdisc")


def main():
    @step("ready")
    def _():
        def active():
            s = show("ActiveState", "SubState", "StatusText", "MainPID", "Result")
            if s.get("ActiveState") == "failed":
                raise RuntimeError(f"shaperd failed: {s}")
            return s if s.get("ActiveState") == "active" and s.get("StatusText") else None
        s, secs = wait_for("shaperd active with a STATUS", active, 90)
        # STATUS goes on after READY; wait for the first reconcile's text.
        s, secs2 = wait_for("STATUS of a reconcile", lambda: (lambda x: x if "reconcile" in x.get("StatusText", "")
                                                               else None)(show("ActiveState", "SubState",
                                                                               "StatusText", "MainPID")), 60)
        return {"show": s, "seconds": secs + secs2}

    @step("status_json")
    def _():
        rc, out, err = run([SHAPERD, "status", "-o", "json", "-c", TENANTS], timeout_s=60)
        return {"rc": rc, "doc": json.loads(out) if out.strip().startswith("{") else None, "stderr": err[-2000:]}

    @step("resources")
    def _():
        pid = show("MainPID")["MainPID"]
        with open(f"/proc/{pid}/status") as f:
            st = dict(l.split(":", 1) for l in f.read().splitlines() if ":" in l)
        return {"show": show("MemoryCurrent", "TasksCurrent", "MemoryMax", "TasksMax", "LimitMEMLOCK"),
                "VmRSS": st["VmRSS"].strip(), "VmHWM": st["VmHWM"].strip(), "Threads": int(st["Threads"])}

    @step("watchdog")
    def _():
        first = show("WatchdogTimestampMonotonic", "WatchdogUSec")
        t0 = first.get("WatchdogTimestampMonotonic", "0")
        later, secs = wait_for("WatchdogTimestamp advancing",
                               lambda: (lambda s: s if s.get("WatchdogTimestampMonotonic", "0") != t0 else None)(
                                   show("WatchdogTimestampMonotonic")), 60)
        return {"first": first, "later": later, "seconds": secs}

    @step("reload")
    def _():
        before = tc_classes()
        with open(TENANTS) as f:
            text = f.read()
        new = text.replace("bandwidthLimit: 300Mbps", "bandwidthLimit: 400Mbps")
        if new == text:
            raise RuntimeError("tenants file has no 'bandwidthLimit: 300Mbps' to change")
        with open(TENANTS, "w") as f:
            f.write(new)
        rc, out, err = run(["systemctl", "reload", "shaperd"])
        if rc != 0:
            raise RuntimeError(f"systemctl reload shaperd: rc {rc}: {err}")

        def has_new_rate():
            cl = tc_classes()
            return cl if any(c.get("ceil") == "400Mbit" for c in cl) else None
        after, secs = wait_for("an HTB class with ceil 400Mbit", has_new_rate, 30)
        return {"before": before, "after": after, "seconds": secs}

    @step("stop")
    def _():
        rc, out, err = run(["systemctl", "stop", "shaperd"], timeout_s=60)
        s = show("ActiveState", "Result", "ExecMainStatus")
        return {"rc": rc, "show": s, "qdiscs": tc_qdiscs(), "classes": tc_classes()}

    @step("journal")
    def _():
        rc, out, err = run(["journalctl", "-u", "shaperd", "-b", "-o", "cat", "--no-pager"])
        with open(f"{OUT}/journal.txt", "w") as f:
            f.write(out)
        return {"lines": len(out.splitlines())}

    @step("journal_all")
    def _():
        rc, out, err = run(["journalctl", "-b", "-o", "short-monotonic", "--no-pager"])
        with open(f"{OUT}/journal-boot.txt", "w") as f:
            f.write(out)
        return {"watchdog_timeouts": [l for l in out.splitlines() if re.search(r"[Ww]atchdog timeout", l)]}


if __name__ == "__main__":
    try:
        main()
        results["done"] = True
        save()
    finally:
        run(["systemctl", "--no-block", "poweroff"])
