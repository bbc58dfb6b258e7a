"""The commit retry policy: exponential backoff with jitter, an attempt and a time budget.

A small frozen value with an injected ``sleep``, ``clock`` and random source, so tests
run instantly and deterministically. The commit loop never retries without sleeping.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class RetryPolicy:
    """How a transaction retries after losing a version slot.

    ``max_attempts`` counts slot claims; ``max_duration`` (seconds) bounds the whole
    commit loop. Delay before retry ``n`` (1-based) is ``min(max_delay, base_delay *
    multiplier**(n-1))`` scaled by a random factor in ``[1 - jitter, 1 + jitter]``, and
    never less than ``min_delay``.
    """

    max_attempts: int = 200
    max_duration: float = 120.0
    # Losing a slot is normal under contention, not overload: start small and grow gently
    # (measured: with base 1 ms x2, four writers spent ~30% of their time sleeping).
    base_delay: float = 0.0005
    multiplier: float = 1.5
    max_delay: float = 0.2
    min_delay: float = 0.0001
    jitter: float = 0.5
    sleep: Callable[[float], None] = field(default=time.sleep, compare=False)
    clock: Callable[[], float] = field(default=time.monotonic, compare=False)
    rng: random.Random = field(default_factory=random.Random, compare=False)

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be >= 1")
        if self.max_duration <= 0 or self.base_delay < 0 or self.max_delay < self.min_delay:
            raise ValueError("invalid retry delays or budget")
        if not 0 <= self.jitter <= 1:
            raise ValueError("jitter must be within [0, 1]")

    def delay(self, attempt: int) -> float:
        """Seconds to sleep before retry number ``attempt`` (1-based)."""
        raw = min(self.max_delay, self.base_delay * self.multiplier ** max(0, attempt - 1))
        scaled = raw * (1 + self.jitter * (2 * self.rng.random() - 1))
        return max(self.min_delay, scaled)

    def exhausted(self, attempts: int, started: float) -> bool:
        return attempts >= self.max_attempts or self.clock() - started >= self.max_duration


DEFAULT_RETRY_POLICY = RetryPolicy()
