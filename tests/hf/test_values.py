"""Values of a config.json (`lmcore.hf.values`): numbers checked before use, within 64 bits
and a float's range; which layers a per-layer field covers, with no step per layer when all or
none do (issue 32)."""

from __future__ import annotations

from lmcore.hf.values import checked, json_text, spread
from lmcore.spec import MAX_INT, MAX_LAYERED

HUGE = 10**12


def test_checked_takes_the_largest_integer_and_a_float_only_within_range() -> None:
    problems: list[str] = []
    assert checked("n", MAX_INT, int, problems) == MAX_INT
    assert checked("n", MAX_INT + 1, int, problems) is None
    assert checked("t", 10**308, float, problems) == 1e308  # an integer a float holds
    assert checked("t", 10**309, float, problems) is None  # past 1.8e308
    assert checked("t", float("inf"), float, problems) is None
    assert checked("t", float("nan"), float, problems) is None
    assert len(problems) == 4
    assert "2**63 - 1" in problems[0] and "float's range" in problems[1]


def test_spread_is_uniform_without_work_per_layer_and_a_list_only_when_small() -> None:
    assert spread(HUGE, range(HUGE)) is True
    assert spread(HUGE, range(HUGE, HUGE)) is False
    assert spread(HUGE, range(0, HUGE, 1), but=[5]) is None  # one layer differs: not sayable
    assert spread(HUGE, range(HUGE + 5, HUGE, 3)) is False  # a step past the last layer
    assert spread(6, range(1, 6, 2)) == [False, True, False, True, False, True]
    assert spread(6, range(0, 6, 1), but=[2, 2, 9]) == [True, True, False, True, True, True]
    assert spread(3, [True, True, True]) is True and spread(3, [False] * 3) is False
    assert spread(MAX_LAYERED + 1, [True, False] * 2049) is None
    assert spread(MAX_LAYERED, range(0, MAX_LAYERED, 2)) == [i % 2 == 0 for i in range(4096)]


def test_a_huge_integer_is_shown_by_its_first_digits_and_length() -> None:
    assert json_text(10**399) == "100000000000...(400 digits)"
    assert json_text(-(10**60)) == "-10000000000...(61 digits)"
    assert json_text(10**59) == str(10**59)
    assert json_text(object()) == "<a object>"
