"""UTC timestamps and the ids that name changelog files (sortable by time, unique without coordination)."""

from __future__ import annotations

import re
import secrets
from datetime import datetime, timedelta, timezone

STAMP_FORMAT = "%Y%m%dT%H%M%S.%fZ"


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def iso(moment: datetime) -> str:
    """2026-11-29T16:47:37.123456Z (the year always 4 digits: strftime's %Y is not, before 1000)"""
    utc = moment.astimezone(timezone.utc)
    return f"{utc.year:04d}-{utc.month:02d}-{utc.day:02d}T{utc.hour:02d}:{utc.minute:02d}:{utc.second:02d}.{utc.microsecond:06d}Z"


def parse_time(text: str) -> datetime:
    """Accepts ISO-8601 (with Z or offset), a date, or 'now'; naive times are UTC."""
    text = text.strip()
    if text == "now":
        return utcnow()
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"{text!r} is not a time (use ISO 8601, e.g. 2026-11-29T16:47:00Z or 2026-11-29)") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    try:
        return moment.astimezone(timezone.utc)
    except OverflowError:
        raise ValueError(f"{text!r} is out of range once converted to UTC (years 1..9999)") from None


_DURATION = re.compile(r"([0-9]{1,12}(?:\.[0-9]{1,9})?)\s*([smhd])")

# Longer than any history knobkeeper keeps, and short enough that `now - duration` is a date.
MAX_DURATION = timedelta(days=36500)


def parse_duration(text: str) -> timedelta:
    """'90s', '30m', '2h', '7d' (ASCII digits; at most 36500d)."""
    match = _DURATION.fullmatch(text.strip())
    if not match:
        raise ValueError(f"{text!r} is not a duration (use a number and s, m, h or d: 30m, 2h, 7d)")
    amount, unit = float(match.group(1)), match.group(2)
    seconds = amount * {"s": 1, "m": 60, "h": 3600, "d": 86400}[unit]
    if seconds > MAX_DURATION.total_seconds():
        raise ValueError(f"{text!r} is too long a duration (at most {MAX_DURATION.days}d)")
    return timedelta(seconds=seconds)


def duration_words(seconds: float) -> str:
    """A duration as parse_duration reads it, in its largest whole unit: 600 -> '10m', 30 -> '30s'."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and float(seconds / size).is_integer():
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


# The earliest time an incident may say its symptom began: older is a typo (0001-01-01), and
# readers compute windows and durations from it.
EARLIEST = datetime(1970, 1, 1, tzinfo=timezone.utc)


def new_id() -> str:
    """8 hex digits from the OS's randomness: two branches never need to agree on them."""
    return secrets.token_hex(4)


def file_stem(moment: datetime, ident: str) -> str:
    """`20261129T164737.123456Z-a1b2c3d4`: sorts by time, unique by id."""
    utc = moment.astimezone(timezone.utc)
    return f"{utc.year:04d}{utc.strftime(STAMP_FORMAT.removeprefix('%Y'))}-{ident}"


def id_from_stem(stem: str) -> str:
    return stem.rsplit("-", 1)[-1]
