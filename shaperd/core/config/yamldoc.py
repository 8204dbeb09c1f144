"""YAML text to Python data, safely: SafeLoader that refuses duplicate keys and stops past the node budget.

Shared by the loader (one tenants file) and the manifests reader (several Kubernetes documents).
Raises ConfigError naming the line and column. Pure: parses only the text it is given.
"""

from __future__ import annotations

from typing import Any

import yaml

from shaperd.core.config import limits as config_limits
from shaperd.core.errors import ConfigError, ConfigProblem



class _UniqueKeyLoader(config_limits.YamlNodeBudget, yaml.SafeLoader):
    """SafeLoader that refuses duplicate mapping keys instead of keeping the last one (and stops past the
    node budget of config_limits)."""


def _construct_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
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


def _yaml(text: str, source: str) -> Any:
    config_limits.check_text_size(len(text), source)  # characters <= bytes: a cheap bound
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e)
        raise ConfigError(source, [ConfigProblem(where, f"not valid YAML: {problem}")]) from e
