"""The largest numbers a run can take, each from what holds it, checked before any work."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from jaxrl_frag.errors import check

INT32_MAX = 2**31 - 1
INT32 = "the compiled program counts in int32"
# the host sums environment steps in float64, exact up to 2**53
EXACT_STEPS = 2**53
# a population holds its members' seeds as uint32
SEED_MAX = 2**32 - 1
# host devices forced on XLA's CPU client, each with its own threads: 4096 start in seconds and 8192 in half a
# minute, 16384 take more than twenty minutes, and from 32768 on the threads cannot all be created and the process
# aborts (exit 134)
CPU_DEVICES_MAX = 4096
# a population's members are built and stacked one by one on the host, about a millisecond each
MEMBERS_MAX = 2**16


def is_whole(value: Any) -> bool:
    """Whether ``value`` is a whole number (an int, or a float or numpy scalar without a fraction)."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int | np.integer):
        return True
    return isinstance(value, float | np.floating) and float(value).is_integer()


def check_count(name: str, value: Any, high: int = INT32_MAX, why: str = INT32, low: int = 1) -> None:
    """Raise ``ConfigError`` unless ``value`` (setting ``name``) is a whole number in ``[low, high]``;
    ``why`` says where ``high`` comes from."""
    least = "a positive integer" if low == 1 else "zero or a positive integer" if low == 0 else f"an integer >= {low}"
    check(is_whole(value) and value >= low, name, value, f"must be {least}")
    check(value <= high, name, value, f"must be at most {high:,} ({why})")


def divisors(n: int, limit: int) -> list[int]:
    """The ``limit`` smallest divisors of ``n`` (in ``sqrt(n)`` steps), for messages that suggest a valid count."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    large = [n // d for d in reversed(small) if d * d != n]
    return (small + large)[:limit]
