"""A background thread that runs one step every period until stopped: the samplers' and checkers' loop.

Subclasses set ``thread_name`` and create ``self._stop`` (a threading.Event)
and ``self._thread = None`` in their constructor; the default step is
``sample_once()`` every ``self.settings.period_s`` on ``self.clock``, and a
subclass with another schedule overrides ``_loop``.
"""

from __future__ import annotations

import threading


class Periodic:
    thread_name = "shaperd-periodic"
    _stop: threading.Event
    _thread: threading.Thread | None

    def _loop(self) -> None:
        while not self._stop.is_set():
            t0 = self.clock()
            self.sample_once()
            self._stop.wait(max(0.0, self.settings.period_s - (self.clock() - t0)))

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name=self.thread_name, daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout_s)
