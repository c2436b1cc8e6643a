"""regret.py: hand-computed values for every formula, and input validation."""

import pytest

from regret import designer_score, hint_regret, plateau


def test_hint_regret_eq3():
    # mean([1, 1, 0, 1]) - mean([0, 1, 0, 0, 0]) = 0.75 - 0.2 = 0.55
    assert hint_regret([1, 1, 0, 1], [0, 1, 0, 0, 0]) == pytest.approx(0.55)
    # negative regret: the hint hurts
    assert hint_regret([0.0, 0.0], [1.0, 0.0]) == pytest.approx(-0.5)


@pytest.mark.parametrize("h,u", [([], [1.0]), ([1.0], []), ([float("nan")], [0.0]),
                                 ([1.0], [float("-inf")])])
def test_hint_regret_validates(h, u):
    with pytest.raises(ValueError):
        hint_regret(h, u)


@pytest.mark.parametrize("w,expected", [
    (0.4, 1.0), (0.5, 1.0), (0.6, 1.0),           # the plateau
    (0.15, 0.0), (0.85, 0.0), (0.0, 0.0), (1.0, 0.0), (-0.5, 0.0),
    (0.275, 0.5),                                 # halfway down the left ramp: 1 - 0.125/0.25
    (0.7, 0.6),                                   # 1 - 0.1/0.25
    (0.3, 0.6),
])
def test_plateau(w, expected):
    assert plateau(w) == pytest.approx(expected)


def test_plateau_validates():
    with pytest.raises(ValueError):
        plateau(float("nan"))
    with pytest.raises(ValueError):
        plateau(0.5, lo=0.6, hi=0.4)


def test_designer_score_blend():
    # 0.4 * clip(0.06 / 0.15, 0, 1) + 0.6 * plateau(0.5) = 0.4 * 0.4 + 0.6 * 1 = 0.76
    assert designer_score(0.06, 0.5) == pytest.approx(0.76)
    # regret saturates at 0.15; w = 0.7 -> plateau 0.6: 0.4 * 1 + 0.6 * 0.6 = 0.76
    assert designer_score(0.5, 0.7) == pytest.approx(0.76)
    # negative regret clips to 0; w = 0.275 -> plateau 0.5: 0.6 * 0.5 = 0.3
    assert designer_score(-0.3, 0.275) == pytest.approx(0.3)
    assert designer_score(0.0, 1.0) == 0.0


def test_designer_score_ablations():
    # the authors' regret_based: r_hint - the epoch's unhinted mean, floored at 0
    assert designer_score(None, 0.4, mode="regret", r_hint=0.7) == pytest.approx(0.3)
    assert designer_score(None, 0.5, mode="regret", r_hint=0.3) == 0.0
    assert designer_score(None, 0.7, mode="solve_rate") == pytest.approx(0.6)


def test_designer_score_faulty_is_zero_and_needs_no_inputs():
    for mode in ("blend", "regret", "solve_rate", "learning_potential"):
        assert designer_score(None, None, mode=mode, faulty=True) == 0.0
    assert designer_score(0.1, 0.5, faulty=True) == 0.0


def test_designer_score_validates():
    with pytest.raises(ValueError):
        designer_score(None, 0.5)                      # blend needs regret
    with pytest.raises(ValueError):
        designer_score(0.1, float("nan"))
    with pytest.raises(ValueError):
        designer_score(0.1, 0.5, mode="regret_plus")
