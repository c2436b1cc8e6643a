"""regret.py: hand-computed values for every formula, and input validation."""
import math

import pytest

from regret import (designer_score, diversity, hint_regret, learnable_share, plateau,
                    reward_granularity, similarity_matrix, zero_variance_share)


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


def test_learnable_share():
    # in [0.2, 0.8]: 0.2, 0.5, 0.8 -> 3 of 6
    assert learnable_share([0.0, 0.2, 0.5, 0.8, 0.81, 1.0]) == pytest.approx(0.5)
    assert learnable_share([]) == 0.0
    with pytest.raises(ValueError):
        learnable_share([0.5, float("nan")])


def test_reward_granularity():
    # env 1: levels {0, 1} -> 2; env 2: {0, 0.25, 0.5, 1} -> 4; env 3: {0} -> 1. mean = 7/3
    envs = [[0.0, 1.0, 1.0, 0.0], [0.0, 0.25, 0.5, 1.0, 0.25], [0.0]]
    assert reward_granularity(envs) == pytest.approx(7 / 3)
    # float noise is not a new level
    assert reward_granularity([[0.1 + 0.2, 0.3]]) == 1.0
    assert reward_granularity([]) == 0.0
    with pytest.raises(ValueError):
        reward_granularity([[0.0, float("inf")]])


def test_zero_variance_share():
    assert zero_variance_share([[1, 1, 1], [0, 1, 0], [0.0, 0.0], [0.5]]) == pytest.approx(0.75)
    assert zero_variance_share([]) == 0.0
    with pytest.raises(ValueError):
        zero_variance_share([[1.0], []])


def test_similarity_is_trigram_cosine():
    # "a b c d" -> {abc, bcd}; "a b c e" -> {abc, bce}; cosine = 1 / (sqrt2 * sqrt2) = 0.5
    K = similarity_matrix(["a b c d", "a b c e"])
    assert K[0, 1] == pytest.approx(0.5) and K[0, 0] == pytest.approx(1.0)


def test_diversity_hand_computed():
    # identical: K = all ones, eigenvalues of K/2 = {1, 0} -> exp(0) = 1
    assert diversity(["a b c d", "a b c d"]) == pytest.approx(1.0)
    # disjoint: K = I, eigenvalues {1/2, 1/2} -> exp(log 2) = 2
    assert diversity(["a b c d", "x y z w"]) == pytest.approx(2.0)
    # cosine 0.5: eigenvalues of K/2 = {0.75, 0.25}
    # H = -(0.75 ln 0.75 + 0.25 ln 0.25) = 0.215762 + 0.346574 = 0.562335 -> e^H = 1.754765
    assert diversity(["a b c d", "a b c e"]) == pytest.approx(1.754765, abs=1e-6)
    # two copies plus one disjoint: eigenvalues of K/3 = {2/3, 1/3}
    # H = -(2/3 ln 2/3 + 1/3 ln 1/3) = 0.636514 -> e^H = 1.889882
    assert diversity(["a b c d", "a b c d", "p q r s"]) == pytest.approx(1.889882, abs=1e-6)


def test_diversity_edge_cases():
    assert diversity([]) == 0.0
    assert diversity(["x = 1"]) == pytest.approx(1.0)
    assert diversity(["", ""]) == pytest.approx(1.0)              # short sources: one whole-gram
    assert diversity(["a", "b"]) == pytest.approx(2.0)
    with pytest.raises(ValueError):
        diversity("class AEnv: pass")
    with pytest.raises(ValueError):
        diversity(["ok", None])


def test_diversity_of_realistic_sources_between_1_and_n():
    base = "class GridEnv:\n    def reset(self, seed=None):\n        return 'start', {}\n"
    other = ("class MazeEnv:\n    def step(self, action):\n"
             "        return 'x', 0.0, False, False, {}\n")
    d = diversity([base, base.replace("Grid", "Maze"), other])
    assert 1.0 < d < 3.0 and math.isfinite(d)
