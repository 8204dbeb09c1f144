"""Bounds on a tenants file, checked before (and while) it is parsed (issue 14).

Owns: the size cap on the file's bytes, the cap on YAML nodes *as expanded
through aliases* (the billion-laughs defence), and the tenant-count limit no
backend can meet. Each refusal is a ConfigError naming the number.
Must not: read anything but the file it is given, or judge the meaning of a
key (config.py does that).

The numbers, and why:

- ``MAX_TENANTS`` = 65,504: HTB gives each tenant a class minor from
  ``TENANT_MINOR_FIRST``..``TENANT_MINOR_LAST`` (0x10..0xFFF0, 65,505 values,
  backends/htb/objects.py), minus the root handle's major 0x7368, which
  backends/ids.assign_minors skips (leaf qdisc majors equal class minors).
  One more tenant and assign_minors would probe forever for a free minor.
- ``MAX_FILE_BYTES`` = 8 MiB: a file of 65,504 tenants in block style, each
  with a label match, is 6.7 MiB (107 bytes a tenant, measured); it parsed
  in 20 s with 666 MiB peak RSS (PyYAML 6.0.4). 8 MiB leaves room for
  comments and longer names while bounding the parse; a 100 MB file is
  refused from its fstat size without reading a byte.
- ``MAX_YAML_NODES`` = 2,000,000 expanded nodes: that largest real file has
  13 nodes a tenant (852,000 in all); 2 M leaves room for cidr lists. An
  alias counts the whole subtree it points to, so nine levels of nine
  aliases ("billion laughs", 9^9 nodes from 81 aliases) are refused while
  parsing (config/yamlbuild.py), after a few thousand nodes, in milliseconds.
- ``MAX_YAML_DEPTH`` = 64 nested collections: the deepest real path is
  root / tenants / tenant / match / podLabels (5). PyYAML's composer (used before config/yamlbuild.py)
  recurses about four Python frames a level, so ``[`` nested a few hundred
  deep ended in a RecursionError traceback (found by tests/fuzz_inputs.py);
  64 is far below that and far above any real file.
"""

from __future__ import annotations

import os

import yaml

from shaperd.core.ids import HANDLE_MAJOR, TENANT_MINOR_FIRST, TENANT_MINOR_LAST
from shaperd.core.errors import ConfigError, ConfigProblem

MAX_TENANTS = TENANT_MINOR_LAST - TENANT_MINOR_FIRST + 1 - (1 if TENANT_MINOR_FIRST <= HANDLE_MAJOR <= TENANT_MINOR_LAST else 0)
MAX_FILE_BYTES = 8 * 2**20
MAX_YAML_NODES = 2_000_000
MAX_YAML_DEPTH = 64


class YamlBudgetExceeded(yaml.YAMLError):
    """Raised from inside the composer; config.yamldoc._yaml turns it into a ConfigError."""

    def __init__(self, count: int):
        self.count = count
        super().__init__(f"more than {MAX_YAML_NODES:,} YAML nodes once aliases are expanded "
                         f"(at least {count:,}); a tenants file needs far fewer (13 a tenant)")


class YamlTooDeep(yaml.YAMLError):
    def __init__(self):
        super().__init__(f"collections nested more than {MAX_YAML_DEPTH} deep; a tenants file needs 5")


class YamlTooManyTenants(yaml.YAMLError):
    """Raised from inside the composer at the first tenant past MAX_TENANTS, before the rest is parsed."""

    def __init__(self, mark):
        self.problem_mark = mark
        super().__init__(tenant_count_message(f"more than {MAX_TENANTS:,}"))


def tenant_count_message(count: str) -> str:
    return (f"{count} tenants, above the limit of {MAX_TENANTS:,}: an HTB device has class minors "
            f"0x{TENANT_MINOR_FIRST:x}..0x{TENANT_MINOR_LAST:x} for tenants (65,505, less the root's 0x{HANDLE_MAJOR:x})")


def check_text_size(nbytes: int, source: str) -> None:
    if nbytes > MAX_FILE_BYTES:
        raise ConfigError(source, [ConfigProblem("", f"file is {nbytes:,} bytes, above the limit of "
                                                 f"{MAX_FILE_BYTES:,} (8 MiB; {MAX_TENANTS:,} tenants fit in 6.7 MiB)")])


def read_capped(path: str | os.PathLike) -> bytes:
    """The file's bytes, refused from its size before reading; a file growing while read is refused too.
    OSError propagates (the caller names the file)."""
    with open(path, "rb") as f:
        check_text_size(os.fstat(f.fileno()).st_size, str(path))
        data = f.read(MAX_FILE_BYTES + 1)
    check_text_size(len(data), str(path))
    return data


def check_tenant_count(raw, bad) -> bool:
    """Refuse more tenants than HTB has class minors, before validating any of them (400,000 tenants
    took 123 s to validate). True if the count is within the limit."""
    if isinstance(raw, list) and len(raw) > MAX_TENANTS:
        bad("tenants", tenant_count_message(f"{len(raw):,}"))
        return False
    return True
