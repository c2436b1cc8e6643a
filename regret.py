"""Rewards and regret: what the agent and the Environment Designer are scored by.

SPADE (arXiv 2608.19197, Sec. 3.3): Eq. (3) and the designer reward of the paper's runs. The agent
is rewarded by its episode return (agent.episode_return); the designer for environments at the
agent's learning frontier, measured by the hint-based regret (the policy plays each new environment
with and without a privileged hint):

    regret(e) = mean_i R_hint(e, s_i) - mean_j R_nohint(e, s_j)                          # Eq. (3)
    score(e)  = 0.4 * clip(regret(e) / 0.15, 0, 1) + 0.6 * plateau(w(e))     (the paper's runs)
    plateau(w) = 1 on [0.4, 0.6], falling linearly to 0 at 0.15 and 0.85  (--plateau_lo/hi/ramp)

w(e) (code: mean_return) is the environment's mean unhinted return over its regeneration epoch;
a "win rate", elsewhere, is the share of unhinted plays with return > 0. The ablations
(--designer_reward) follow the authors' code: "regret" is their regret_based max(0, r_hint - w)
(r_hint 0 without a hint), -0.5 for a timeout at its regeneration step; "learning_potential" is
|w - mu_slow(skill)| with per-skill fast/slow EMAs of the epoch mean return; "solve_rate" is
plateau(w). Inputs are validated (NaN / inf and empty arms of Eq. (3) raise ValueError). The
logged statistics of a run (learnable shares, win rates, formula reveals, diversity) are
infra/metrics.py's.

Deviations from the paper (and from the authors' code):
    1. An environment ended by an environment fault scores 0 (`faulty=True`); the authors give the
       agent -1 for a crash and silently drop timeouts (train.py drops faulty episodes).
    2. Regret uses common random numbers (both arms play one seed list; the caller's job).

Dependencies: standard library only.
Test: `pytest tests/test_regret.py`
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

DESIGNER_MODES = ("blend", "regret", "solve_rate", "learning_potential")
STEP_TIMEOUT_PENALTY = -0.5  # the authors' regret_based score of a game whose step timed out
LP_GAMMAS = (0.98, 0.85)     # the authors' fast / slow EMA weights of a new value


def _finite(x, name: str) -> float:
    """x as a float, or a ValueError naming `name` if it is None, a bool, NaN or inf."""
    if x is None or isinstance(x, bool) or not math.isfinite(float(x)):
        raise ValueError(f"{name} must be a finite number, got {x!r}")
    return float(x)


def _finite_list(xs: Iterable, name: str) -> list[float]:
    return [_finite(x, f"{name}[{i}]") for i, x in enumerate(xs)]


# ALGO: the designer's reward ---------------------------------------------------------------------

def hint_regret(hinted_returns: Sequence[float], unhinted_returns: Sequence[float]) -> float:
    """Eq. (3): mean hinted return minus mean unhinted return (both arms must be non-empty)."""
    hinted = _finite_list(hinted_returns, "hinted_returns")
    unhinted = _finite_list(unhinted_returns, "unhinted_returns")
    if not (hinted and unhinted):
        raise ValueError("Eq. (3) needs returns in both arms")
    return sum(hinted) / len(hinted) - sum(unhinted) / len(unhinted)  # Eq. (3)


def plateau(w: float, lo: float = 0.4, hi: float = 0.6, ramp: float = 0.25) -> float:
    """1 on [lo, hi], falling linearly to 0 at lo - ramp and hi + ramp (0 beyond)."""
    w = _finite(w, "w")
    if not (lo <= hi and ramp > 0):
        raise ValueError(f"need lo <= hi and ramp > 0, got lo={lo}, hi={hi}, ramp={ramp}")
    # clip(1 - dist(w, [lo, hi]) / ramp, 0, 1)
    return max(0.0, 1.0 - max(lo - w, 0.0, w - hi) / ramp)


def designer_score(regret: float | None, mean_return: float | None, mode: str = "blend",
                   faulty: bool = False, r_hint: float | None = None, timed_out: bool = False,
                   baseline: float | None = None, band: tuple = (0.4, 0.6, 0.25)) -> float:
    """The designer's score of one environment: regret is Eq. (3) at its regeneration step,
    mean_return w its mean unhinted return over the epoch. Modes (the module docstring): "blend"
    (the paper's runs), and the ablations "regret" (max(0, r_hint - w), -0.5 if a step timed out),
    "solve_rate" and "learning_potential" (baseline: the skill's slow EMA); band: plateau's (lo,
    hi, ramp). An input the mode does not use may be None. A faulty environment scores 0, below
    its skill's mean (except a timeout under "regret")."""
    if mode not in DESIGNER_MODES:
        raise ValueError(f"mode must be one of {DESIGNER_MODES}, got {mode!r}")
    if mode == "regret" and timed_out:
        return STEP_TIMEOUT_PENALTY
    if faulty:
        return 0.0
    if mode == "regret":  # r_hint - mean of all epoch plays, floored at 0
        return max(0.0, _finite(r_hint, "r_hint") - _finite(mean_return, "mean_return"))
    if mode == "solve_rate":
        return plateau(_finite(mean_return, "mean_return"), *band)
    if mode == "learning_potential":  # |w - mu_slow(skill)|
        return abs(_finite(mean_return, "mean_return") - _finite(baseline, "baseline"))
    regret, w = _finite(regret, "regret"), _finite(mean_return, "mean_return")
    # score = 0.4 * clip(regret / 0.15, 0, 1) + 0.6 * plateau(w)
    return 0.4 * min(1.0, max(0.0, regret / 0.15)) + 0.6 * plateau(w, *band)


def learning_potential_update(mu: Sequence[float] | None, r: float,
                              gammas: tuple[float, float] = LP_GAMMAS) -> list[float]:
    """One update of a skill's [mu_fast, mu_slow] with its epoch mean return r (the authors'
    learning-potential trackers): the first value sets both, then mu <- (1 - g) mu + g r."""
    r = _finite(r, "r")
    return [r, r] if mu is None else [(1 - g) * m + g * r for m, g in zip(mu, gammas)]
