"""How values, percentages and untrusted text are shown to people: the one formatting module.

Human output goes through `safe()`: reasons, values and names come from files anyone can edit,
and printed raw they could move the cursor, fake log lines (a newline) or reorder text (bidi
overrides). JSON output stays raw: JSON escapes what it must.
"""

from __future__ import annotations

import json
import re
import signal
from typing import Any

UNSET = "(unset)"


def value(v: Any) -> str:
    """A knob value as people read it: (unset), true/false, or the text (secrets are fingerprints)."""
    if v is None:
        return UNSET
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def quoted(v: Any) -> str:
    """Like `value`, but strings and booleans as JSON so that spaces, quotes and "" stay visible."""
    if v is None:
        return UNSET
    return json.dumps(v) if isinstance(v, (str, bool)) else str(v)


def quoted_if_needed(v: str | None) -> str:
    """A value from a launch script: bare when it reads unambiguously, JSON-quoted otherwise."""
    if v is None:
        return UNSET
    return json.dumps(v) if v == "" or any(c in v for c in " \t\n\"'$\\") else v


def pct(x: float | None, digits: int = 1) -> str:
    """A relative effect as a signed percentage: 0.128 -> '+12.8%'; None -> 'n/a'."""
    return "n/a" if x is None else f"{x * 100:+.{digits}f}%"


def num(x: Any) -> str:
    """A measurement: floats to one decimal, None -> 'n/a'."""
    if x is None:
        return "n/a"
    return f"{x:.1f}" if isinstance(x, float) else str(x)


def p_value(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3g}"


def plain_number(x: float) -> str:
    """A bound or default without a spurious '.0': 4.0 -> '4', 0.5 -> '0.5'."""
    return str(int(x)) if float(x).is_integer() else str(x)


def short(text: str, width: int = 70) -> str:
    """One line of at most `width` characters (whitespace runs collapsed)."""
    line = " ".join(str(text).split())
    return line if len(line) <= width else line[: width - 3] + "..."


_UNSAFE = re.compile(r"[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\u200e\u200f\u061c\u2028\u2029]")


def _escape(ch: str) -> str:
    if ch == "\n":
        return "\\n"
    if ch == "\t":
        return "\\t"
    if ch == "\r":
        return "\\r"
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def safe(text: Any) -> str:
    """`text` with every control character, escape sequence introducer, line/paragraph separator
    and bidi control shown as a visible escape (\\x1b, \\n, \\u202e): safe to print on a terminal,
    one line whatever it holds."""
    return _UNSAFE.sub(lambda m: _escape(m.group()), str(text))


def cell(text: Any) -> str:
    """A markdown table cell: one line, pipes and angle brackets escaped."""
    s = " ".join(safe(text).split())
    return s.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


# What a process killed by a signal most often means, said beside the signal's name: the words a
# gate or the PD proof puts in its one line when an engine's process died.
_SIGNAL_WORDS = {
    "SIGILL": "illegal instruction",
    "SIGKILL": "killed: likely the OOM killer, see dmesg",
    "SIGSEGV": "segmentation fault",
    "SIGBUS": "bus error",
    "SIGABRT": "aborted",
    "SIGFPE": "arithmetic exception",
    "SIGTERM": "terminated",
    "SIGINT": "interrupted",
}


def exit_words(code: int) -> str:
    """A process's exit status as people read it: Python's multiprocessing gives -N for "killed by
    signal N", a shell 128+N. -4 -> 'SIGILL (illegal instruction)'; 1 -> 'exit status 1'."""
    number = -code if code < 0 else code - 128 if 128 < code < 160 else None
    if number is None:
        return f"exit status {code}"
    try:
        name = signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
    words = _SIGNAL_WORDS.get(name)
    return f"{name} ({words})" if words else name


def change(old: str | None, new: str | None) -> str:
    """A value's change in words: "set to 512 (was unset)", "unset (was 64)", "128 -> 512"."""
    if old is None:
        return f"set to {quoted_if_needed(new)} (was unset)"
    if new is None:
        return f"unset (was {quoted_if_needed(old)})"
    return f"{quoted_if_needed(old)} -> {quoted_if_needed(new)}"
