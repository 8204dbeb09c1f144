"""The delay between failed attempts to reach the API server.

Owns the schedule only: ``delay_s(attempt, rng)`` is a pure function of
the attempt number and a random source, so a test can give a seeded
``random.Random`` and know every delay in advance.

Must not: sleep or count attempts; the watcher does both.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with jitter between failed attempts.

    initial_s 0.5: a dropped connection usually heals at once (API server
    rolling update, load balancer). max_s 30: every node of a large cluster
    retries, and a 30 s ceiling keeps that load flat during an outage while
    still noticing the server's return within half a minute. jitter 0.5:
    each delay is drawn from [d/2, d] so thousands of nodes do not retry in
    lockstep.
    """

    initial_s: float = 0.5
    max_s: float = 30.0
    factor: float = 2.0
    jitter: float = 0.5

    def delay_s(self, attempt: int, rng: random.Random) -> float:
        """Seconds to wait after the ``attempt``-th failure in a row (0 = the first)."""
        d = min(self.max_s, self.initial_s * self.factor ** max(0, attempt))
        return d * (1.0 - self.jitter * rng.random())
