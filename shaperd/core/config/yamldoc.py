"""YAML text to Python data, safely: a safe loader that refuses duplicate keys and stops past the node budget.

Shared by the loader (one tenants file) and the manifests reader (several Kubernetes documents).
Raises ConfigError naming the line and column. Pure: parses only the text it is given.

Two loaders give the same answers (tests/unit/test_config_loaders.py runs both on the bad-input corpus,
and against PyYAML's own SafeLoader on valid YAML): ``FastLoader`` scans and parses in libyaml (C) where
PyYAML was built with it; ``PyLoader`` in PyYAML's pure Python. Both build the data from the parser's
events with config/yamlbuild.EventBuilder, which checks depth, node budget, tenant count and duplicate
keys at each event, before anything past a limit is parsed, and keeps no node graph. libyaml's own
composer is not used: it recurses in C with no depth limit (``[`` nested 100,000 deep is a segfault).
libyaml does not refuse the control characters PyYAML's Reader refuses, so FastLoader checks them first.
"""

from __future__ import annotations

from typing import Any

import yaml

from shaperd.core.config import limits as config_limits
from shaperd.core.config import yamlbuild
from shaperd.core.errors import ConfigError, ConfigProblem


class _PyEventLoader(yamlbuild.EventBuilder, yaml.reader.Reader, yaml.scanner.Scanner, yaml.parser.Parser,
                     yaml.constructor.SafeConstructor, yaml.resolver.Resolver):
    """PyYAML's pure-Python reader, scanner and parser (events), built into data by EventBuilder."""

    def __init__(self, stream):
        yaml.reader.Reader.__init__(self, stream)
        yaml.scanner.Scanner.__init__(self)
        yaml.parser.Parser.__init__(self)
        yaml.constructor.SafeConstructor.__init__(self)
        yaml.resolver.Resolver.__init__(self)


PyLoader: Any = _PyEventLoader
FastLoader: Any = PyLoader
if getattr(yaml, "__with_libyaml__", False):
    from yaml.cyaml import CParser

    class _CEventLoader(yamlbuild.EventBuilder, CParser, yaml.constructor.SafeConstructor, yaml.resolver.Resolver):
        """libyaml's scanner and parser (events, in C), built into data by EventBuilder. EventBuilder's
        methods come first in the MRO, so CParser's recursive C composer is never called."""

        def __init__(self, stream):
            _check_printable(stream)
            CParser.__init__(self, stream)
            yaml.constructor.SafeConstructor.__init__(self)
            yaml.resolver.Resolver.__init__(self)

    FastLoader = _CEventLoader


def _check_printable(text: Any) -> None:
    """Refuse what PyYAML's Reader refuses (and libyaml lets through), with the Reader's own error."""
    if isinstance(text, str):
        m = yaml.reader.Reader.NON_PRINTABLE.search(text)
        if m:
            raise yaml.reader.ReaderError("<unicode string>", m.start(), ord(m.group()), "unicode",
                                          "special characters are not allowed")


def _yaml(text: str, source: str, loader: Any = None) -> Any:
    config_limits.check_text_size(len(text), source)  # characters <= bytes: a cheap bound
    try:
        return yaml.load(text, Loader=loader or FastLoader)  # noqa: S506 - safe constructors only
    except yaml.YAMLError as e:
        raise yaml_error(e, source) from e


def load_all(text: str, source: str, loader: Any = None) -> list[Any]:
    """Every non-empty document of the text, parsed once."""
    config_limits.check_text_size(len(text), source)
    try:
        return [d for d in yaml.load_all(text, Loader=loader or FastLoader) if d is not None]  # noqa: S506
    except yaml.YAMLError as e:
        raise yaml_error(e, source) from e


def yaml_error(e: yaml.YAMLError, source: str) -> ConfigError:
    """A YAML error as a ConfigError naming the line, column and problem (the tenant-count refusal
    names the field, as validation would)."""
    if isinstance(e, config_limits.YamlTooManyTenants):
        mark = e.problem_mark
        return ConfigError(source, [ConfigProblem("tenants", f"{e} (the first one over starts on line {mark.line + 1})")])
    if getattr(e, "problem", None) == "exceeded maximum nesting depth":  # libyaml >= 0.2.5 stops at 1000 levels
        e = config_limits.YamlTooDeep()  # while scanning ahead, before our composer's check at 64 sees it
    mark = getattr(e, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else ""
    problem = getattr(e, "problem", None) or str(e)
    return ConfigError(source, [ConfigProblem(where, f"not valid YAML: {problem}")])
