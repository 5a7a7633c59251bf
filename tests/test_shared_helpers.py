import pytest

from beam_ext.clock import ManualClock
from beam_ext.state._arrow_blocks import decode_values, encode_values
from beam_ext.transforms._fields import MissingFieldError, field_getter


class _Obj:
    amount = 7


def test_field_getter_reads_keys_attributes_and_callables():
    assert field_getter("amount", "v")({"amount": 3}) == 3
    assert field_getter("amount", "v")(_Obj()) == 7
    assert field_getter(lambda e: e * 2, "v")(4) == 8


def test_field_getter_names_field_and_event():
    with pytest.raises(MissingFieldError, match=r"sum\('x'\): event has no field 'x': \{'y': 1\}"):
        field_getter("x", "sum('x')")({"y": 1})


def test_value_blocks_round_trip():
    values = [b"", b"a", bytes(range(256)) * 10]
    assert decode_values(encode_values(values)) == values


def test_manual_clock_only_moves_forward():
    c = ManualClock(1.0)
    c.advance(2.0)
    assert c.now() == 3.0
    with pytest.raises(ValueError):
        c.set(2.0)
