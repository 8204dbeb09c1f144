"""Read what the subnet manager programmed on this node's InfiniBand ports: SL2VL and VLArb, through smpquery.

Kernel side because smpquery opens /dev/infiniband/umadN and sends SMPs.
Read-only: only Get queries, addressed by direct route to the port itself
(``-C DEV -P PORT -D ... 0``), so no LID or routing is needed; shaperd never
sets these tables from a node. Each smpquery runs from an argument list, in
its own process group, with a deadline (the group is killed on timeout).
The parsers take smpquery's text (infiniband-diags smpquery.c: sl2vl_table,
vlarb_table) and are tested on output captured from OpenSM on ibsim.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from shaperd.core.errors import ShaperdError

SMPQUERY = "smpquery"
DEFAULT_TIMEOUT_S = 10.0


class SmpError(ShaperdError):
    """The tables of a port could not be read; the message is the reason ("smpquery not found ...")."""


@dataclass(frozen=True)
class Sl2VlRow:
    in_port: int
    out_port: int
    vls: tuple[int, ...]  # VL for SL 0..15


@dataclass(frozen=True)
class VlArb:
    port: int
    low_cap: int
    high_cap: int
    low: tuple[tuple[int, int], ...]  # (VL, weight) per entry, as many as the port's capacity
    high: tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class PortTables:
    """SL2VL and VL arbitration of one CA port, as the port reports them."""

    device: str
    port: int
    sl2vl: tuple[int, ...]
    vlarb: VlArb


class SmpParseError(ValueError):
    pass


_SL2VL_ROW = re.compile(r"^ports: in\s+(\d+), out\s+(\d+):\s*\|(.*)\|\s*$")
_VLARB_HEAD = re.compile(r"^# VLArbitration tables: .* port (\d+) LowCap (\d+) HighCap (\d+)\s*$")
_SECTION = re.compile(r"^# (Low|High) priority VL Arbitration Table:\s*$")
_ROW = re.compile(r"^(VL|WEIGHT)\s*:\s*\|(.*)\|\s*$")


def parse_sl2vl(text: str) -> tuple[Sl2VlRow, ...]:
    rows = []
    for n, line in enumerate(text.splitlines(), start=1):
        m = _SL2VL_ROW.match(line)
        if not m:
            continue
        cells = [c.strip() for c in m.group(3).split("|")]
        try:
            vls = tuple(int(c) for c in cells)
        except ValueError:
            raise SmpParseError(f"line {n}: expected VL numbers, got {line!r}") from None
        if len(vls) != 16:
            raise SmpParseError(f"line {n}: expected 16 VLs (SL 0-15), got {len(vls)}")
        rows.append(Sl2VlRow(int(m.group(1)), int(m.group(2)), vls))
    if not rows:
        raise SmpParseError("no 'ports: in N, out M:' row in the SL2VL output")
    return tuple(rows)


def parse_vlarb(text: str) -> VlArb | None:
    """The port's tables; None where there are none (a switch's base port 0)."""
    if any(line.startswith("# No VLArbitration tables") for line in text.splitlines()):
        return None
    head = None
    section: str | None = None
    cells: dict[str, dict[str, list[int]]] = {"Low": {"VL": [], "WEIGHT": []}, "High": {"VL": [], "WEIGHT": []}}
    for n, line in enumerate(text.splitlines(), start=1):
        if (m := _VLARB_HEAD.match(line)) is not None:
            head = tuple(int(x) for x in m.groups())
        elif (m := _SECTION.match(line)) is not None:
            section = m.group(1)
        elif (m := _ROW.match(line)) is not None:
            if section is None:
                raise SmpParseError(f"line {n}: a {m.group(1)} row before any table heading")
            try:
                cells[section][m.group(1)].extend(int(c.strip(), 16) for c in m.group(2).split("|"))
            except ValueError:
                raise SmpParseError(f"line {n}: expected hex numbers, got {line!r}") from None
    if head is None:
        raise SmpParseError("no '# VLArbitration tables: ... LowCap N HighCap M' heading")
    port, low_cap, high_cap = head
    tables = {}
    for name, cap in (("Low", low_cap), ("High", high_cap)):
        vls, ws = cells[name]["VL"], cells[name]["WEIGHT"]
        if len(vls) != len(ws) or len(vls) != cap:
            raise SmpParseError(f"{name.lower()} table: {len(vls)} VLs and {len(ws)} weights for a capacity of {cap}")
        tables[name] = tuple(zip(vls, ws))
    return VlArb(port=port, low_cap=low_cap, high_cap=high_cap, low=tables["Low"], high=tables["High"])


def smpquery(device: str, port: int, args: Sequence[str], *, timeout_s: float = DEFAULT_TIMEOUT_S,
             wrapper: Sequence[str] = (), env: Mapping[str, str] | None = None) -> str:
    """Run ``smpquery -C DEV -P PORT ARGS...``; its stdout, or SmpError with the reason."""
    argv = [*wrapper, SMPQUERY, "-C", device, "-P", str(port), *args]
    what = f"smpquery {' '.join(args)} on {device}:{port}"
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True, env=None if env is None else dict(env))
    except FileNotFoundError as e:
        raise SmpError(f"{e.filename or SMPQUERY} not found (install infiniband-diags)") from e
    except OSError as e:
        raise SmpError(f"{what}: cannot run: {e.strerror or e}") from e
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.communicate()
        raise SmpError(f"{what}: no answer within {timeout_s:g} s") from None
    if proc.returncode != 0:
        last = [l for l in (err or "").splitlines() if l.strip()]
        raise SmpError(f"{what}: exit status {proc.returncode}: {last[-1].strip() if last else 'no message'}")
    return out


def read_port(device: str, port: int, *, timeout_s: float = DEFAULT_TIMEOUT_S, wrapper: Sequence[str] = (),
              env: Mapping[str, str] | None = None) -> PortTables:
    """SL2VL and VLArb of a CA port, queried by direct route to itself; SmpError says why not."""
    kw = dict(timeout_s=timeout_s, wrapper=wrapper, env=env)
    sl_text = smpquery(device, port, ["-D", "sl2vl", "0"], **kw)
    arb_text = smpquery(device, port, ["-D", "vlarb", "0", str(port)], **kw)
    try:
        rows = parse_sl2vl(sl_text)
        vlarb = parse_vlarb(arb_text)
    except SmpParseError as e:
        raise SmpError(f"smpquery on {device}:{port}: unexpected output: {e}") from e
    if vlarb is None:
        raise SmpError(f"{device}:{port} has no VL arbitration tables (a switch's base port 0, not a CA port)")
    return PortTables(device=device, port=port, sl2vl=rows[0].vls, vlarb=vlarb)


def unavailable(*, euid: Callable[[], int] = os.geteuid, which: Callable[..., str | None] = shutil.which,
                env: Mapping[str, str] | None = None) -> str | None:
    """Why this process cannot read SM tables (smpquery not on PATH, not root), or None when it can try."""
    if which(SMPQUERY, path=(os.environ if env is None else env).get("PATH")) is None:
        return f"{SMPQUERY} not found (install infiniband-diags)"
    if euid() != 0:
        return f"needs root ({SMPQUERY} opens /dev/infiniband/umadN)"
    return None


def reader(*, timeout_s: float = DEFAULT_TIMEOUT_S, wrapper: Sequence[str] = (),
           env: Mapping[str, str] | None = None, euid: Callable[[], int] = os.geteuid,
           which: Callable[..., str | None] = shutil.which) -> Callable[[str, int], PortTables]:
    """``read(device, port)`` for the node-side check; SmpError with the reason when smpquery cannot run at all
    (probed on each read, so installing infiniband-diags later is noticed by a running daemon)."""
    def read(device: str, port: int) -> PortTables:
        if (why := unavailable(euid=euid, which=which, env=env)) is not None:
            raise SmpError(why)
        return read_port(device, port, timeout_s=timeout_s, wrapper=wrapper, env=env)

    return read
