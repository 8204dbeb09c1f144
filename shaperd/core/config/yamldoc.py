"""YAML text to Python data, safely: a safe loader that refuses duplicate keys and stops past the node budget.

Shared by the loader (one tenants file) and the manifests reader (several Kubernetes documents).
Raises ConfigError naming the line and column. Pure: parses only the text it is given.

Two loaders give the same answers (tests/unit/test_config_loaders.py runs both on the bad-input corpus):
``FastLoader`` scans and parses in libyaml (C) where PyYAML was built with it, and composes and
constructs in Python; ``PyLoader`` is PyYAML's pure-Python SafeLoader. Both compose with PyYAML's
Python Composer under config/limits.YamlNodeBudget, so depth, node budget and tenant count are
checked at each event, before anything past the limit is parsed: libyaml's own composer recurses in C
with no depth limit (``[`` nested 100,000 deep is a segfault), which is why it is not used. libyaml
does not refuse the control characters PyYAML's Reader refuses, so FastLoader checks them first.
"""

from __future__ import annotations

from typing import Any

import yaml

from shaperd.core.config import limits as config_limits
from shaperd.core.errors import ConfigError, ConfigProblem



class _UniqueKeyLoader(config_limits.YamlNodeBudget, yaml.SafeLoader):
    """SafeLoader that refuses duplicate mapping keys instead of keeping the last one (and stops past the
    node budget of config_limits)."""


PyLoader = _UniqueKeyLoader


def _construct_mapping(loader: Any, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: dict[Any, Any] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        try:
            hash(key)
        except TypeError:  # "? []": PyYAML would raise the TypeError from our `in` below
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping", node.start_mark, "found an unhashable key", key_node.start_mark
            ) from None
        if key in seen:
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping", node.start_mark, f"found duplicate key {key!r}", key_node.start_mark
            )
        seen[key] = True
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)

FastLoader: Any = PyLoader
if getattr(yaml, "__with_libyaml__", False):
    from yaml.cyaml import CParser

    class _CUniqueKeyLoader(config_limits.YamlNodeBudget, yaml.composer.Composer, CParser,
                            yaml.constructor.SafeConstructor, yaml.resolver.Resolver):
        """libyaml's scanner and parser (events), PyYAML's Composer (bounded by YamlNodeBudget) and
        SafeConstructor with the duplicate-key check. The Composer's methods come before CParser's in
        the MRO, so CParser's recursive C composer is never called."""

        def __init__(self, stream):
            _check_printable(stream)
            CParser.__init__(self, stream)
            yaml.composer.Composer.__init__(self)
            yaml.constructor.SafeConstructor.__init__(self)
            yaml.resolver.Resolver.__init__(self)

    _CUniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
    FastLoader = _CUniqueKeyLoader


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
