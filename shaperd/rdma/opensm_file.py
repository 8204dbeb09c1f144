"""Put shaperd's QoS block into an OpenSM options file's text; pure (text in, text out).

Owns the editing rule: the lines that set a key shaperd owns
(``opensm.OWNED_KEYS``: qos, qos_* and qos_ca_/qos_swe_/qos_sw0_*) and a
previous shaperd block (between its marker comments) are removed; the new
block goes where the previous block or the first owned key was, else at the
end. Every other line (comments, other options, qos_policy_file, qos_rtr_*)
is kept byte for byte. A line's key is found the way OpenSM finds it
(osm_subnet.c osm_subn_parse_conf_file): cut at the first '#', then the first
token separated by space, tab or newline.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from shaperd.core.errors import ShaperdError
from shaperd.rdma.opensm import BEGIN_MARK, END_MARK, OWNED_KEYS

_SEP = re.compile(r"[ \t\n]+")  # strtok_r(line, " \t\n"): not \r, not \f


class OptionsFileError(ShaperdError):
    """The file cannot be edited safely (say where, and what to fix by hand)."""


@dataclass(frozen=True)
class Merge:
    text: str
    replaced: tuple[tuple[int, str], ...]  # (line number, key) of owned option lines removed outside the block
    previous_block: bool  # a shaperd block was there and was replaced
    kept: int  # lines kept unchanged

    def changed(self, old: str) -> bool:
        return self.text != old


def option_key(line: str) -> str | None:
    """The option a line sets, as OpenSM reads it; None for blank and comment lines."""
    body = line.split("#", 1)[0]
    return next((p for p in _SEP.split(body) if p), None)


def merge(existing: str, block: str, name: str = "the options file") -> Merge:
    if not block.endswith("\n"):
        block += "\n"
    lines = existing.splitlines(keepends=True)
    out: list[str] = []
    replaced: list[tuple[int, str]] = []
    insert_at: int | None = None
    previous = False
    in_block_since: int | None = None
    kept = 0
    for i, line in enumerate(lines, start=1):
        stripped = line.rstrip("\r\n")
        if in_block_since is not None:
            if stripped.startswith(BEGIN_MARK):
                raise OptionsFileError(f"{name} line {i}: a second shaperd begin marker inside the block opened at "
                                       f"line {in_block_since}; remove one block by hand")
            if stripped == END_MARK:
                in_block_since = None
            continue
        if stripped.startswith(BEGIN_MARK):
            if previous:
                raise OptionsFileError(f"{name} line {i}: a second shaperd block; remove one by hand")
            previous = True
            in_block_since = i
            insert_at = len(out) if insert_at is None else insert_at
            continue
        if stripped == END_MARK:
            raise OptionsFileError(f"{name} line {i}: a shaperd end marker without its begin marker; "
                                   "remove it by hand")
        key = option_key(line)
        if key in OWNED_KEYS:
            replaced.append((i, key))
            insert_at = len(out) if insert_at is None else insert_at
            continue
        out.append(line)
        kept += 1
    if in_block_since is not None:
        raise OptionsFileError(f"{name} line {in_block_since}: shaperd's begin marker has no end marker "
                               f"({END_MARK!r}); fix the file by hand")
    if insert_at is None:
        if out and not out[-1].endswith("\n"):
            out[-1] += "\n"
        insert_at = len(out)
    out.insert(insert_at, block)
    return Merge(text="".join(out), replaced=tuple(replaced), previous_block=previous, kept=kept)
