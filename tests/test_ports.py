"""knobkeeper/ports.py: ports picked for services that restart lie outside the kernel's ephemeral range."""

from __future__ import annotations

import random
import socket

import pytest

from knobkeeper import ports


def test_a_picked_port_is_free_below_the_ephemeral_range_and_never_handed_out_twice():
    first, last = ports.ephemeral_range()
    picked = [ports.free_port() for _ in range(200)]
    assert len(set(picked)) == 200
    assert all(not first <= p <= last and p >= ports.LOWEST for p in picked), (first, last, picked)
    with socket.socket() as sock:          # free: a plain bind (no SO_REUSEADDR) takes it
        sock.bind(("127.0.0.1", picked[-1]))


def test_a_port_in_use_is_not_picked(monkeypatch):
    """A pool of 1000 ports below the (patched) range, every one handed out but the held one: the pick
    fails instead of returning it. (No neighbour is expected free: on a busy machine any port of the
    real ephemeral range, where `taken` comes from, may be some connection's.)"""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        taken = held.getsockname()[1]
        held.listen()
        monkeypatch.setattr(ports, "ephemeral_range", lambda: (taken + 1, 65535))
        monkeypatch.setattr(ports, "LOWEST", taken - 999)
        monkeypatch.setattr(ports, "_handed_out", set(range(taken - 999, taken)))
        with pytest.raises(OSError, match=f"no free TCP port outside the ephemeral range {taken + 1}-65535"):
            ports.free_port(rng=random.Random(1))


def test_the_range_file_is_read_and_an_unreadable_one_means_linuxs_default(tmp_path):
    (tmp_path / "range").write_text("20000\t40000\n")
    assert ports.ephemeral_range(tmp_path / "range") == (20000, 40000)
    assert ports.ephemeral_range(tmp_path / "missing") == ports.DEFAULT_EPHEMERAL == (32768, 60999)
    assert ports.in_ephemeral_range(45243) and not ports.in_ephemeral_range(30200)


def test_no_room_outside_the_range_says_so(monkeypatch):
    monkeypatch.setattr(ports, "_free_on", lambda port, addresses: False)
    with pytest.raises(OSError, match="no free TCP port outside the ephemeral range"):
        ports.free_port()
