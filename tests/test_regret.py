"""regret.py: hand-computed values for every formula, and input validation."""

import inspect

import pytest

from regret import (DESIGNER_MODES, SCORES, blend, fault_score, hint_regret, learning_potential,
                    learning_potential_update, plateau, regret_based, solve_rate)


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


def test_blend():
    # 0.4 * clip(0.06 / 0.15, 0, 1) + 0.6 * plateau(0.5) = 0.4 * 0.4 + 0.6 * 1 = 0.76
    assert blend(regret=0.06, mean_return=0.5) == pytest.approx(0.76)
    # regret saturates at 0.15; w = 0.7 -> plateau 0.6: 0.4 * 1 + 0.6 * 0.6 = 0.76
    assert blend(regret=0.5, mean_return=0.7) == pytest.approx(0.76)
    # negative regret clips to 0; w = 0.275 -> plateau 0.5: 0.6 * 0.5 = 0.3
    assert blend(regret=-0.3, mean_return=0.275) == pytest.approx(0.3)
    assert blend(regret=0.0, mean_return=1.0) == 0.0
    # band [0.2, 0.4], ramp 0.2: w = 0.5 -> plateau 1 - 0.1 / 0.2 = 0.5; 0.4 * 1 + 0.6 * 0.5 = 0.7
    assert blend(regret=0.15, mean_return=0.5, band=(0.2, 0.4, 0.2)) == pytest.approx(0.7)


def test_regret_based():
    # the authors' regret_based: r_hint - the epoch's unhinted mean, floored at 0
    assert regret_based(r_hint=0.7, mean_return=0.4) == pytest.approx(0.3)
    assert regret_based(r_hint=0.3, mean_return=0.5) == 0.0
    assert regret_based(r_hint=0.0, mean_return=0.0) == 0.0  # no hint: r_hint 0


def test_solve_rate():
    assert solve_rate(mean_return=0.7) == pytest.approx(0.6)   # 1 - 0.1 / 0.25
    assert solve_rate(mean_return=0.5) == 1.0
    assert solve_rate(mean_return=0.5, band=(0.2, 0.4, 0.2)) == pytest.approx(0.5)


def test_learning_potential():
    # |w - mu_slow|: |0.3 - 0.925| = 0.625, |0.9 - 0.4| = 0.5
    assert learning_potential(mean_return=0.3, mu_slow=0.925) == pytest.approx(0.625)
    assert learning_potential(mean_return=0.9, mu_slow=0.4) == pytest.approx(0.5)
    # the trackers: the first value sets both; then mu <- (1 - g) mu + g r with g = (0.98, 0.85)
    mu = learning_potential_update(None, 0.5)
    assert mu == [0.5, 0.5]
    assert learning_potential_update(mu, 1.0) == [pytest.approx(0.99), pytest.approx(0.925)]


def test_scores_has_one_function_per_mode_naming_its_inputs():
    names = {mode: list(inspect.signature(f).parameters) for mode, f in SCORES.items()}
    assert names == {"blend": ["regret", "mean_return", "band"],
                     "regret": ["r_hint", "mean_return"],
                     "solve_rate": ["mean_return", "band"],
                     "learning_potential": ["mean_return", "mu_slow"]}
    assert DESIGNER_MODES == tuple(SCORES)


def test_fault_score():
    for mode in DESIGNER_MODES:
        assert fault_score(mode) == 0.0
    assert fault_score("regret", timed_out=True) == -0.5   # the authors' step timeout
    assert fault_score("blend", timed_out=True) == 0.0
    with pytest.raises(ValueError):
        fault_score("regret_plus")


def test_the_scores_validate():
    with pytest.raises(ValueError):
        blend(regret=None, mean_return=0.5)
    with pytest.raises(ValueError):
        blend(regret=0.1, mean_return=float("nan"))
    with pytest.raises(ValueError):
        regret_based(r_hint=float("inf"), mean_return=0.5)
    with pytest.raises(ValueError):
        learning_potential(mean_return=0.5, mu_slow=None)
