"""YAML events to Python data in one pass, with every guard: the node budget (an alias counts as the
size of what it names), the depth limit, the tenant-count refusal and the duplicate-key check.

PyYAML composes a whole document into a graph of Node objects, each with two Marks, before it constructs
anything: for a 65,504-tenant file that graph was most of a 464 MiB peak, and walking it twice (compose,
then construct) most of the time. Here each event becomes data as it arrives: scalars are resolved and
constructed at once, collections are filled in place, and nothing outlives its event but the result and
the anchors' values. An anchored collection is registered before its contents, so an alias inside it
gives the same recursive structure PyYAML would.

``EventBuilder`` is a mixin for a loader class that supplies the events (libyaml's CParser or PyYAML's
Python Parser) and PyYAML's SafeConstructor and Resolver for the tags: it replaces the Composer and the
Constructor's document walk (``yaml.load`` and ``yaml.load_all`` call the three ``*_data`` methods), so
both loaders give the same answers by construction. Tags on collections: the default map and seq, and
SafeConstructor's ``!!set``, ``!!omap`` and ``!!pairs``; any other is refused as PyYAML refuses it.
Pure: parses only the text it is given.
"""

from __future__ import annotations

import types
from typing import Any

import yaml
from yaml.composer import ComposerError
from yaml.constructor import ConstructorError
from yaml.events import (AliasEvent, DocumentEndEvent, MappingEndEvent, MappingStartEvent, ScalarEvent,
                         SequenceEndEvent, SequenceStartEvent, StreamEndEvent, StreamStartEvent)
from yaml.nodes import MappingNode, ScalarNode, SequenceNode

from shaperd.core.config import limits as config_limits

_STR = "tag:yaml.org,2002:str"
_MAP = "tag:yaml.org,2002:map"
_SEQ = "tag:yaml.org,2002:seq"
_SET = "tag:yaml.org,2002:set"
_OMAP = "tag:yaml.org,2002:omap"
_PAIRS = "tag:yaml.org,2002:pairs"


class EventBuilder:
    """Builds each document straight from the parser's events (see the module docstring). Put it first
    in the loader's bases, before the parser and SafeConstructor."""

    max_yaml_nodes = config_limits.MAX_YAML_NODES

    # --- PyYAML's loader protocol: yaml.load calls get_single_data, yaml.load_all the other two ---

    def check_data(self) -> bool:
        if self.check_event(StreamStartEvent):
            self.get_event()
        return not self.check_event(StreamEndEvent)

    def get_data(self) -> Any:
        if self.check_data():
            return self._document()[0]
        return None

    def get_single_data(self) -> Any:
        self.get_event()  # StreamStart
        data, mark = None, None
        if not self.check_event(StreamEndEvent):
            data, mark = self._document()
        if not self.check_event(StreamEndEvent):
            event = self.get_event()
            raise ComposerError("expected a single document in the stream", mark,
                                "but found another document", event.start_mark)
        self.get_event()  # StreamEnd
        return data

    # --- building ---

    def _document(self) -> tuple[Any, Any]:
        if not hasattr(self, "_budget_count"):
            self._budget_count = 0
        self._anchors: dict[str, tuple[Any, Any, int]] = {}  # anchor -> (value, start mark, node count)
        self.get_event()  # DocumentStart
        event = self.get_event()
        data = self._value(event, 1, False)
        ev = self.get_event()
        assert isinstance(ev, DocumentEndEvent), ev
        self._anchors = {}
        return data, event.start_mark

    def _charge(self, n: int) -> None:
        self._budget_count += n
        if self._budget_count > self.max_yaml_nodes:
            raise config_limits.YamlBudgetExceeded(self._budget_count)

    def _value(self, event: Any, depth: int, tenants: bool) -> Any:
        """The data of the node that starts with ``event`` (already taken from the parser), at nesting
        ``depth`` (the root is 1). ``tenants``: this is the root's ``tenants`` sequence."""
        cls = type(event)
        if cls is AliasEvent:
            try:
                value, _, size = self._anchors[event.anchor]
            except KeyError:
                raise ComposerError(None, None, f"found undefined alias {event.anchor!r}", event.start_mark) from None
            self._charge(size)
            return value
        self._charge(1)
        if depth > config_limits.MAX_YAML_DEPTH:
            raise config_limits.YamlTooDeep()
        anchor = event.anchor
        if anchor is not None and anchor in self._anchors:
            raise ComposerError(f"found duplicate anchor {anchor!r}; first occurrence", self._anchors[anchor][1],
                                "second occurrence", event.start_mark)
        before = self._budget_count
        if cls is ScalarEvent:
            value = self._scalar(event)
        elif cls is MappingStartEvent:
            value = self._mapping(event, depth, anchor)
        elif cls is SequenceStartEvent:
            value = self._sequence(event, depth, anchor, tenants)
        else:  # the parser never gives another event here
            raise ComposerError(None, None, f"unexpected {event.__class__.__name__}", event.start_mark)
        if anchor is not None:
            self._anchors[anchor] = (value, event.start_mark, self._budget_count - before + 1)
        return value

    def _scalar(self, event: Any) -> Any:
        tag = event.tag
        if tag is None or tag == "!":
            tag = self.resolve(ScalarNode, event.value, event.implicit)
        if tag == _STR:
            return event.value
        node = ScalarNode(tag, event.value, event.start_mark, event.end_mark, event.style)
        return self._construct(tag, node)

    def _construct(self, tag: str, node: Any) -> Any:
        """SafeConstructor's constructor for the tag (construct_undefined if none), run to the end."""
        constructor = self.yaml_constructors.get(tag) or self.yaml_constructors[None]
        try:
            data = constructor(self, node)
            if isinstance(data, types.GeneratorType):  # the collection constructors yield, then fill
                gen, data = data, next(data)
                for _ in gen:
                    pass
        except (ValueError, TypeError, AttributeError, KeyError, OverflowError) as e:  # "!!int x": PyYAML's own
            # constructors raise these (a traceback from yaml.safe_load); here it is a YAML error with a line
            raise ConstructorError(None, None, f"cannot read {node.value!r} as {tag}: {e}", node.start_mark) from None
        return data

    def _collection_tag(self, event: Any, kind: type) -> str:
        tag = event.tag
        if tag is None or tag == "!":
            return self.resolve(kind, None, event.implicit)
        return tag

    def _mapping(self, start: Any, depth: int, anchor: str | None) -> Any:
        tag = self._collection_tag(start, MappingNode)
        if tag not in (_MAP, _SET):
            self._wrong_kind(tag, "mapping", start)
        data: Any = {} if tag == _MAP else set()
        if anchor is not None:  # registered before its contents: an alias inside is this object
            self._anchors[anchor] = (data, start.start_mark, 1)
        get_event = self.get_event
        while True:
            kev = get_event()
            if type(kev) is MappingEndEvent:
                return data
            key = self._value(kev, depth + 1, False)
            try:
                dup = key in data  # a dict's keys or a set's members
            except TypeError:  # "? []": a key that cannot be a dict key
                raise ConstructorError("while constructing a mapping", start.start_mark,
                                       "found an unhashable key", kev.start_mark) from None
            if dup:
                raise ConstructorError("while constructing a mapping", start.start_mark,
                                       f"found duplicate key {key!r}", kev.start_mark)
            vev = get_event()
            value = self._value(vev, depth + 1,
                                depth == 1 and key == "tenants" and type(vev) is SequenceStartEvent)
            if tag == _MAP:
                data[key] = value
            else:
                data.add(key)

    def _sequence(self, start: Any, depth: int, anchor: str | None, tenants: bool) -> Any:
        tag = self._collection_tag(start, SequenceNode)
        if tag not in (_SEQ, _OMAP, _PAIRS):
            self._wrong_kind(tag, "sequence", start)
        items: list = []
        if anchor is not None:
            self._anchors[anchor] = (items, start.start_mark, 1)
        get_event = self.get_event
        while True:
            ev = get_event()
            if type(ev) is SequenceEndEvent:
                break
            if tenants and len(items) >= config_limits.MAX_TENANTS:
                raise config_limits.YamlTooManyTenants(ev.start_mark)
            items.append(self._value(ev, depth + 1, False))
        if tag == _SEQ:
            return items
        what = "an ordered map" if tag == _OMAP else "pairs"
        pairs = []
        for item in items:  # each must be a one-item mapping, as SafeConstructor checks it
            if not isinstance(item, dict):
                found = "sequence" if isinstance(item, list) else "scalar"
                raise ConstructorError(f"while constructing {what}", start.start_mark,
                                       f"expected a mapping of length 1, but found {found}", start.start_mark)
            if len(item) != 1:
                raise ConstructorError(f"while constructing {what}", start.start_mark,
                                       f"expected a single mapping item, but found {len(item)} items", start.start_mark)
            pairs.extend(item.items())
        items[:] = pairs
        return items

    def _wrong_kind(self, tag: str, kind: str, start: Any) -> None:
        """A collection under a tag that is not for it: refused with PyYAML's words."""
        if tag not in self.yaml_constructors:
            raise ConstructorError(None, None, f"could not determine a constructor for the tag {tag!r}",
                                   start.start_mark)
        expected = {_MAP: "a mapping node", _SET: "a mapping node", _SEQ: "a sequence node",
                    _OMAP: "a sequence", _PAIRS: "a sequence"}.get(tag, "a scalar node")
        raise ConstructorError(None, None, f"expected {expected}, but found {kind}", start.start_mark)
