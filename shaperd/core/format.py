"""The read commands' output conventions: ``-o text|json|yaml`` (``--json`` kept as an alias) and colour.

Owns: the option (``add_output``), turning a command's result object into
JSON or YAML (``dump``; dataclasses, enums, addresses, sets and bytes made
plain), and whether colour may be used (``use_color``: a terminal and no
NO_COLOR, https://no-color.org). Each command builds ONE object for both
machine formats, so json and yaml cannot disagree.

Must not: read the kernel or the tenants file, or decide exit codes.
"""

from __future__ import annotations

import dataclasses
import enum
import ipaddress
import json
import os
import sys

FORMATS = ("text", "json", "yaml")


def add_output(p, help_text: str = "output format (default text)") -> None:
    """``-o/--output text|json|yaml`` and ``--json`` (the older spelling of ``-o json``), both into ``args.output``."""
    p.add_argument("-o", "--output", choices=FORMATS, default="text", help=help_text)
    p.add_argument("--json", dest="output", action="store_const", const="json", help="same as -o json")


def machine(args) -> bool:
    """True when the command should print ``dump`` output instead of its table."""
    return getattr(args, "output", "text") != "text"


def plain(obj):
    """``obj`` as JSON-able data: dataclasses to dicts, tuples/sets to lists, enums/addresses to strings."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: plain(getattr(obj, f.name)) for f in dataclasses.fields(obj) if f.repr}
    if isinstance(obj, dict):
        return {str(plain(k)) if not isinstance(k, str) else k: plain(v) for k, v in obj.items()}
    if isinstance(obj, (frozenset, set)):
        return sorted((plain(v) for v in obj), key=repr)
    if isinstance(obj, (list, tuple)):
        return [plain(v) for v in obj]
    if isinstance(obj, enum.Enum):
        return plain(obj.value)
    if isinstance(obj, (ipaddress._BaseAddress, ipaddress._BaseNetwork)):
        return str(obj)
    if isinstance(obj, bytes):
        return obj.hex()
    if obj is None or isinstance(obj, (str, int, float, bool)):
        return obj
    return str(obj)


def dump(obj, fmt: str, indent: int = 1) -> str:
    """``obj`` as JSON (one document) or YAML (block style, keys in the object's order); no trailing newline."""
    data = plain(obj)
    if fmt == "yaml":
        import yaml

        return yaml.safe_dump(data, sort_keys=False, default_flow_style=False, allow_unicode=True).rstrip("\n")
    if fmt == "json":
        return json.dumps(data, indent=indent)
    raise ValueError(f"dump: unknown format {fmt!r}; expected json or yaml")


def emit(obj, args, indent: int = 1) -> None:
    print(dump(obj, args.output, indent=indent))
    sys.stdout.flush()


def use_color(stream=None, environ=None) -> bool:
    """Colour only on a terminal, and never when NO_COLOR is set to anything non-empty."""
    stream = sys.stdout if stream is None else stream
    environ = os.environ if environ is None else environ
    if environ.get("NO_COLOR"):
        return False
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def paint(text: str, sgr: str, enabled: bool) -> str:
    """``text`` in the SGR colour ``sgr`` (e.g. "32" green) when ``enabled``; unchanged otherwise."""
    return f"\x1b[{sgr}m{text}\x1b[0m" if enabled and text else text


def table(head: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    """Left-aligned columns, two spaces apart, as lines (trailing blanks removed)."""
    lines = [head, *rows]
    widths = [max(len(l[i]) for l in lines) for i in range(len(head))]
    return ["  ".join(c.ljust(w) for c, w in zip(l, widths)).rstrip() for l in lines]
