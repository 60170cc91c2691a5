"""UTC timestamps and the ids that name changelog files (sortable by time, unique without coordination)."""

from __future__ import annotations

import re
import secrets
from datetime import datetime, timedelta, timezone

STAMP_FORMAT = "%Y%m%dT%H%M%S.%fZ"


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def iso(moment: datetime) -> str:
    """2026-11-29T16:47:37.123456Z"""
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


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
    return moment.astimezone(timezone.utc)


_DURATION = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhd])$")


def parse_duration(text: str) -> timedelta:
    """'90s', '30m', '2h', '7d'."""
    match = _DURATION.match(text.strip())
    if not match:
        raise ValueError(f"{text!r} is not a duration (use a number and s, m, h or d: 30m, 2h, 7d)")
    amount, unit = float(match.group(1)), match.group(2)
    return timedelta(seconds=amount * {"s": 1, "m": 60, "h": 3600, "d": 86400}[unit])


def new_id() -> str:
    """8 hex digits from the OS's randomness: two branches never need to agree on them."""
    return secrets.token_hex(4)


def file_stem(moment: datetime, ident: str) -> str:
    """`20261129T164737.123456Z-a1b2c3d4`: sorts by time, unique by id."""
    return f"{moment.astimezone(timezone.utc).strftime(STAMP_FORMAT)}-{ident}"


def id_from_stem(stem: str) -> str:
    return stem.rsplit("-", 1)[-1]
