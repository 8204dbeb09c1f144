"""The backend registry: the one list of enforcement paths, and what is derived from it.

Each backend package exports one ``SPEC`` (shaperd/core/protocol.py ``BackendSpec``) from its
``spec.py``; ``BUILTIN`` lists them, one line each. The engine builds the backends from it, the
kernel writer gets their encoders from it, the probe their programs, and status, top, metrics and
the command line iterate it: adding a backend is adding its folder and its line here.

``REGISTRY`` is the process's registry; tests register a toy backend with ``REGISTRY.added(spec)``.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

from shaperd.backends.dcb.spec import SPEC as DCB
from shaperd.backends.devlink.spec import SPEC as DEVLINK
from shaperd.backends.edt.spec import SPEC as EDT
from shaperd.backends.htb.spec import SPEC as HTB
from shaperd.backends.ingress.spec import SPEC as INGRESS
from shaperd.backends.marks.spec import SPEC as MARKS
from shaperd.backends.nccl.spec import SPEC as NCCL
from shaperd.backends.podingress.spec import SPEC as PODINGRESS
from shaperd.backends.vfrate.spec import SPEC as VFRATE
from shaperd.core.protocol import BackendSpec, NodeContext
from shaperd.kernel import probe as kernel_probe
from shaperd.kernel.tc import NO_CODEC, Codec

BUILTIN: tuple[BackendSpec, ...] = (HTB, EDT, INGRESS, MARKS, PODINGRESS, DEVLINK, DCB, NCCL, VFRATE)


class Registry:
    def __init__(self, specs=BUILTIN):
        self._specs: list[BackendSpec] = list(specs)

    @property
    def specs(self) -> list[BackendSpec]:
        """In reconcile order (edt after htb: a device moving between the two is released by one first)."""
        return sorted(self._specs, key=lambda s: s.order)

    def spec(self, name: str) -> BackendSpec | None:
        return next((s for s in self._specs if s.name == name), None)

    @contextlib.contextmanager
    def added(self, spec: BackendSpec) -> Iterator[BackendSpec]:
        """``spec`` registered for the duration (tests: a toy backend seen everywhere, then gone)."""
        if self.spec(spec.name) is not None:
            raise ValueError(f"a backend named {spec.name!r} is registered already")
        self._specs.append(spec)
        try:
            yield spec
        finally:
            self._specs.remove(spec)

    def build(self, ctx: NodeContext) -> list:
        return [s.factory(ctx) for s in self.specs]

    def codec(self) -> Codec:
        """Every backend's tc encoders, for the node's writer."""
        out = NO_CODEC
        for s in self.specs:
            if s.codec is not None:
                out = out | s.codec
        return out

    def program_checks(self) -> kernel_probe.ProgramChecks:
        fields: dict = {}
        for s in self.specs:
            fields.update(s.program_checks)
        return kernel_probe.ProgramChecks(**fields)


REGISTRY = Registry()
