"""synkhronos.transport.protocol: the named commands and collectives."""

from __future__ import annotations

from synkhronos.rank.collective_part import PARTS
from synkhronos.transport.protocol import (
    DISCARD_UPDATES,
    FORGET_DATA,
    TIMELINE,
    Collective,
    Command,
)


def test_every_collective_kind_has_a_part():
    assert set(PARTS) == set(Collective)
    assert len({f.__name__ for f in PARTS.values()}) == len(Collective)


def test_flags_leave_the_command_codes_intact():
    flags = [FORGET_DATA, DISCARD_UPDATES, TIMELINE]
    assert len(set(flags)) == 3 and all(f & (f - 1) == 0 for f in flags)  # distinct bits
    for code in Command:
        word = code | DISCARD_UPDATES | TIMELINE
        assert 0 <= code < min(flags) and Command(word & ~(DISCARD_UPDATES | TIMELINE)) == code
