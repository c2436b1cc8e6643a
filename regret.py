"""Rewards and regret: what the agent and the Environment Designer are scored by.

SPADE (arXiv 2608.19197, Sec. 3.3): Eq. (3) and the designer reward of the paper's runs. The agent
is rewarded by its episode return (agent.episode_return); the designer for environments at the
agent's learning frontier, measured by the hint-based regret (the policy plays each new environment
with and without a privileged hint):

    regret(e) = mean_i R_hint(e, s_i) - mean_j R_nohint(e, s_j)                          # Eq. (3)
    score(e)  = 0.4 * clip(regret(e) / 0.15, 0, 1) + 0.6 * plateau(w(e))     (the paper's runs)
    plateau(w) = 1 on [0.4, 0.6], falling linearly to 0 at 0.15 and 0.85  (--plateau_lo/hi/ramp)

w(e) (code: mean_return) is the environment's mean unhinted return over its regeneration epoch;
a "win rate", elsewhere, is the share of unhinted plays with return > 0. Each --designer_reward
is one function of SCORES, whose parameters name the inputs it scores with: "blend" (the paper's
runs, above), and the ablations, as the authors' code has them: "regret", their regret_based
max(0, r_hint - w) (r_hint 0 without a hint), -0.5 for a timeout at its regeneration step;
"learning_potential", |w - mu_slow(skill)| with per-skill fast/slow EMAs of the epoch mean return;
"solve_rate", plateau(w). A faulty environment, or one without an input its function names, scores
fault_score instead. Inputs are validated (NaN / inf and empty arms of Eq. (3) raise ValueError).
The logged statistics of a run (learnable shares, win rates, formula reveals, diversity) are
infra/metrics.py's.

Deviations from the paper (and from the authors' code):
    1. An environment ended by an environment fault scores 0 (fault_score); the authors give the
       agent -1 for a crash and silently drop timeouts (train.py drops faulty episodes).
    2. Regret uses common random numbers (both arms play one seed list; the caller's job).

Dependencies: standard library only.
Test: `pytest tests/test_regret.py`
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

PLATEAU_BAND = (0.4, 0.6, 0.25)  # plateau's (lo, hi, ramp) in the paper's runs
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


# The designer's score of one environment, one function per --designer_reward (SCORES); each names
# its inputs: regret, Eq. (3) at the regeneration step; mean_return, w over the epoch; r_hint, the
# mean hinted return at the regeneration step; mu_slow, the skill's slow tracker; band, plateau's
# (lo, hi, ramp).

def blend(regret: float, mean_return: float, band: tuple = PLATEAU_BAND) -> float:
    """The paper's runs: regret at the learning frontier and w on the plateau, blended."""
    regret, w = _finite(regret, "regret"), _finite(mean_return, "mean_return")
    # score = 0.4 * clip(regret / 0.15, 0, 1) + 0.6 * plateau(w)
    return 0.4 * min(1.0, max(0.0, regret / 0.15)) + 0.6 * plateau(w, *band)


def regret_based(r_hint: float, mean_return: float) -> float:
    """The authors' regret_based ablation: max(0, r_hint - w), w the mean of every unhinted play
    of the epoch (r_hint 0 for an environment left without a hint)."""
    return max(0.0, _finite(r_hint, "r_hint") - _finite(mean_return, "mean_return"))


def solve_rate(mean_return: float, band: tuple = PLATEAU_BAND) -> float:
    """The solve-rate ablation: plateau(w)."""
    return plateau(_finite(mean_return, "mean_return"), *band)


def learning_potential(mean_return: float, mu_slow: float) -> float:
    """The learning-potential ablation: |w - mu_slow(skill)| (learning_potential_update keeps
    mu_slow)."""
    return abs(_finite(mean_return, "mean_return") - _finite(mu_slow, "mu_slow"))


SCORES = {"blend": blend, "regret": regret_based, "solve_rate": solve_rate,
          "learning_potential": learning_potential}
DESIGNER_MODES = tuple(SCORES)  # the --designer_reward choices


def fault_score(mode: str, timed_out: bool = False) -> float:
    """The score of an environment that faulted, or that lacks an input its mode's function names
    (no plays, no regret): 0, below its skill's mean (deviation 1); under "regret" a step that
    timed out at its regeneration step scores the authors' -0.5."""
    if mode not in SCORES:
        raise ValueError(f"mode must be one of {DESIGNER_MODES}, got {mode!r}")
    return STEP_TIMEOUT_PENALTY if mode == "regret" and timed_out else 0.0


def learning_potential_update(mu: Sequence[float] | None, r: float,
                              gammas: tuple[float, float] = LP_GAMMAS) -> list[float]:
    """One update of a skill's [mu_fast, mu_slow] with its epoch mean return r (the authors'
    learning-potential trackers): the first value sets both, then mu <- (1 - g) mu + g r."""
    r = _finite(r, "r")
    return [r, r] if mu is None else [(1 - g) * m + g * r for m, g in zip(mu, gammas)]
