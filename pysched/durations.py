"""Durations as people write them: ``90``, ``90s``, ``5m``, ``1h30m``, ``2d``."""

from __future__ import annotations

import math
import re

# The shortest interval a schedule may have (cron's finest field is the
# second) and the longest (a year and a day).
MIN_INTERVAL_S = 1.0
MAX_INTERVAL_S = 366 * 86_400.0

_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86_400.0, "w": 604_800.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
_WHOLE = re.compile(r"(?:\d+(?:\.\d+)?(?:ms|s|m|h|d|w))+")


def parse_seconds(text: str) -> float:
    """Seconds in ``text``: a number of seconds, or numbers with units
    (ms, s, m, h, d, w) one after the other, largest first or not. Raises
    ValueError saying what is understood."""
    cleaned = text.strip().lower().replace(" ", "")
    try:
        seconds = float(cleaned)
    except ValueError:
        if not _WHOLE.fullmatch(cleaned):
            raise ValueError(
                f"{text[:40]!r} is not a duration: seconds, or numbers with units ms, s, m, h, d, w, such as 90s,"
                " 5m, 1h30m"
            ) from None
        seconds = sum(float(number) * _UNIT_S[unit] for number, unit in _PART.findall(cleaned))
    if not math.isfinite(seconds):
        raise ValueError(f"{text[:40]!r} is not a finite duration")
    return seconds


def format_seconds(seconds: float) -> str:
    """``seconds`` the way parse_seconds reads it back, to the millisecond:
    300 is 5m, 5400 is 1h30m, 1.5 is 1.5s, 90061.25 is 1d1h1m1.25s."""
    millis = round(seconds * 1000)
    whole, fraction = divmod(millis, 1000)
    parts = []
    for unit, size in (("d", 86_400), ("h", 3600), ("m", 60)):
        count, whole = divmod(whole, size)
        if count:
            parts.append(f"{count}{unit}")
    if whole or fraction or not parts:
        parts.append(f"{whole}.{fraction:03d}".rstrip("0").rstrip(".") + "s")
    return "".join(parts)
