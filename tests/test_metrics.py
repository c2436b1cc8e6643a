"""metrics.py: hand-computed values of the paper's run statistics (Figs. 7, 9, 19), the per-step
environment statistics, and input validation."""
import math
import random
from types import SimpleNamespace as NS

import pytest

from infra import metrics
import train
from infra.metrics import (diversity, learnable_share, reward_granularity, similarity_matrix,
                     zero_variance_share)


def _env(env_id, returns):
    return train.PoolEnv(env_id, "Optimization", "src", "XEnv", "designer", returns=list(returns))


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


def test_learnable_slot_share_counts_unfilled_slots_as_zero():
    # epoch 1: 24 slots, 20 valid, 6 of them in [0.2, 0.8]; epoch 2: 24 slots, 24 valid, 12 in band
    e1 = ([0.5] * 6 + [0.0] * 10 + [1.0] * 4, 24)
    e2 = ([0.2] * 6 + [0.8] * 6 + [0.9] * 12, 24)
    assert metrics.learnable_slot_share([e1, e2]) == pytest.approx(18 / 48)
    assert metrics.learnable_slot_share([]) == 0.0


def test_epoch_learnable_keeps_one_16_step_window():
    hist = {"epochs": [], "sources": []}
    envs = [_env("a", [1, 0, 0, 0]), _env("b", [1, 1]), _env("c", [0, 0])]  # win 0.25, 1.0, 0.0
    envs.append(train.PoolEnv("f", "Optimization", "src", "FEnv", "fallback", returns=[1, 0]))
    assert metrics.epoch_learnable(hist, envs, 0, 4) == {"env/learnable_slot_share": 0.25}  # 1 / 4
    assert metrics.epoch_learnable(hist, envs[:1], 12, 4)["env/learnable_slot_share"] == 2 / 8
    assert metrics.epoch_learnable(hist, envs[:1], 16, 4)["env/learnable_slot_share"] == 1 / 4  # new window


def test_formula_reveal_detector():
    for text in ("Hidden rule: y = 3*x + 2. Guess y for x = 4.", "f(n) = n^2 - 1", "Use the formula to win",
                 "The price is computed as cost times 2"):
        assert metrics.reveals_formula(text), text
    for text in ("Turn 3/12 | HP 7/10 | Items: key", "Gold = 100", "Guess the hidden number."):
        assert not metrics.reveals_formula(text), text


def test_regen_figures_formula_rate_and_window_diversity():
    hist = {"epochs": [], "sources": []}
    pool = [train.PoolEnv("a", "S", "x = 1\ny = 2\n", "AEnv", "designer"),
            train.PoolEnv("b", "S", "class B: pass\n", "BEnv", "designer"),
            train.PoolEnv("c", "S", "class C: pass\n", "CEnv", "carried")]
    eps = [NS(env_id="a", hinted=False, messages=[{"content": "Observation: the rule is x + 1"}]),
           NS(env_id="a", hinted=False, messages=[{"content": "later plays are not looked at"}]),
           NS(env_id="b", hinted=True, messages=[{"content": "the formula (hinted)"}]),
           NS(env_id="b", hinted=False, messages=[{"content": "Observation: pick a door"}]),
           NS(env_id="c", hinted=False, messages=[{"content": "the formula"}])]
    m = metrics.regen_figures(0, pool, True, eps, hist, steps=400, rng=random.Random(1))
    assert m == {"designer/formula_reveal_rate": 0.5, "designer/diversity": pytest.approx(
        metrics.diversity(["x = 1\ny = 2\n", "class B: pass\n"]))} and len(hist["sources"]) == 2
    m = metrics.regen_figures(39, pool, False, [], hist, steps=400,
                              rng=random.Random(1))  # the 40-step window closes
    assert m["designer/diversity_window"] == pytest.approx(metrics.diversity(["x = 1\ny = 2\n", "class B: pass\n"]))
    assert hist["sources"] == []


def test_windowed_diversity_subsamples_24_twelve_times():
    sources = [f"class E{i}:\n    value = {i} * {i % 5}\n" for i in range(30)]
    rng = random.Random(0)
    expected = sum(metrics.diversity(rng.sample(sources, 24)) for _ in range(12)) / 12
    assert metrics.windowed_diversity(sources, random.Random(0)) == pytest.approx(expected)
    assert metrics.windowed_diversity(sources[:5], random.Random(0)) == pytest.approx(metrics.diversity(sources[:5]))
