"""Rewards and regret: what the agent and the Environment Designer are scored by.

SPADE (arXiv 2608.19197), Eq. (3) and the designer reward of the paper's runs. The agent is
rewarded by its episode return (agent.episode_return); the designer for environments at the
agent's learning frontier, measured by the hint-based regret (the policy plays each new
environment with and without a privileged hint):

    regret(e) = mean_i R_hint(e, s_i) - mean_j R_nohint(e, s_j)                          # Eq. (3)
    score(e)  = 0.4 * clip(regret(e) / 0.15, 0, 1) + 0.6 * plateau(w(e))     (the paper's runs)
    plateau(w) = 1 on [0.4, 0.6], falling linearly to 0 at 0.15 and 0.85  (--plateau_lo/hi/ramp)

w(e) (code: mean_return) is the environment's mean unhinted return over its regeneration epoch;
a "win rate", elsewhere, is the share of unhinted plays with return > 0. The ablations
(--designer_reward) follow the authors' code: "regret" is their regret_based max(0, r_hint - w),
-0.5 for a timeout at its regeneration step; "learning_potential" is |w - mu_slow(skill)| with
per-skill fast/slow EMAs of the epoch mean return; "solve_rate" is plateau(w). Also here: the
logged environment statistics (learnable shares, reward granularity, zero-variance groups, the
formula-reveal detector of Fig. 9, diversity). Inputs are validated (NaN / inf and empty arms
of Eq. (3) raise ValueError); a statistic over no environments is 0.0, never NaN.

Deviations from the paper (and from the authors' code):
    1. An environment ended by an environment fault scores 0 (`faulty=True`); the authors give the
       agent -1 for a crash and silently drop timeouts (train.py drops faulty episodes).
    2. Regret uses common random numbers (both arms play one seed list; the caller's job).
    3. Diversity (Vendi score over token-trigram cosine similarity of the sources) is our choice;
       the paper reports diversity qualitatively.

Dependencies: standard library + numpy only.
Test: `pytest tests/test_regret.py`
"""
from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Sequence

import numpy as np

DESIGNER_MODES = ("blend", "regret", "solve_rate", "learning_potential")
STEP_TIMEOUT_PENALTY = -0.5          # the authors' regret_based score of a game whose step timed out
LP_GAMMAS = (0.98, 0.85)             # the authors' fast / slow EMA weights of a new value


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
    return max(0.0, 1.0 - max(lo - w, 0.0, w - hi) / ramp)  # clip(1 - dist(w, [lo, hi]) / ramp, 0, 1)


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


# ALGO: environment statistics (logged, not trained on) -------------------------------------------

def learnable_share(mean_returns: Sequence[float], lo: float = 0.2, hi: float = 0.8) -> float:
    """Share of environments whose mean unhinted return is in [lo, hi]; 0.0 for no environments."""
    rates = _finite_list(mean_returns, "mean_returns")
    return sum(lo <= w <= hi for w in rates) / len(rates) if rates else 0.0


def learnable_slot_share(epochs: Sequence[tuple[Sequence[float], int]], lo: float = 0.2,
                         hi: float = 0.8) -> float:
    """The paper's learnable share (Fig. 7) over a window of regeneration epochs, each given as
    the win rates of its valid designer environments and its slot capacity N (unfilled slots
    count as not learnable):  share = sum_e #{i : lo <= w_i <= hi} / sum_e N_e  (0.0 for no N)"""
    slots = sum(n for _, n in epochs)
    hits = sum(lo <= w <= hi for rates, _ in epochs for w in _finite_list(rates, "win_rates"))
    return hits / slots if slots else 0.0


# An explicit formula in an observation: a name set equal to an arithmetic expression
# ("y = 3*x + 2", "score = a * b"), or words that announce one.
_FORMULA = re.compile(r"[A-Za-z_]\w*(?:\([^)\n]*\))?\s*=\s*[^=\n]*?[\w)]\s*[-+*/^%]\s*[\w(]"
                      r"|\b(?:formula|the rule is|is computed as|is calculated as)\b", re.I)


def reveals_formula(observation: str) -> bool:
    """Whether a first observation states the formula behind the game (Fig. 9's formula-reveal
    rate is the share of a regeneration's new environments for which this holds)."""
    return bool(_FORMULA.search(observation))


def reward_granularity(env_rewards: Sequence[Sequence[float]]) -> float:
    """Mean number of distinct reward values per environment (one list of observed rewards per
    environment), compared after rounding to 9 decimals so float noise invents no level: a binary
    win/lose environment scores 2 (1 if one outcome was seen), shaped rewards more; 0.0 for none."""
    counts = [len({round(v, 9) for v in _finite_list(rewards, f"env_rewards[{i}]")})
              for i, rewards in enumerate(env_rewards)]
    return sum(counts) / len(counts) if counts else 0.0


def zero_variance_share(groups: Sequence[Sequence[float]]) -> float:
    """Share of GRPO groups whose returns are all equal (no gradient); 0.0 for none; max() of an
    empty group raises ValueError."""
    flat = [_finite_list(g, f"groups[{i}]") for i, g in enumerate(groups)]
    return sum(max(g) == min(g) for g in flat) / len(flat) if flat else 0.0


# ALGO: diversity of one regeneration (deviation 3) -------------------------------------------------
# The Vendi score (Friedman & Dieng, 2023) under a token-trigram cosine kernel: a source is split
# into words and single punctuation characters and becomes a bag of its token trigrams (one
# whole-tuple "gram" when shorter); K[i, j] = cosine(counts_i, counts_j), lambda the eigenvalues
# of K / n, Vendi = exp(-sum_k lambda_k log lambda_k): the "effective number of distinct
# environments", 1 for identical sources, n when no two share a trigram. Cheap, deterministic, and
# sensitive to copy-paste environments, the failure it exists to catch.

_CODE_TOKEN = re.compile(r"\w+|[^\w\s]")


def _trigram_counts(source: str, n: int = 3) -> Counter:
    tokens = _CODE_TOKEN.findall(source)
    if len(tokens) < n:
        return Counter([tuple(tokens)])
    return Counter(tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1))


def similarity_matrix(sources: Sequence[str]) -> np.ndarray:
    """K (n, n): cosine similarity of the sources' token-trigram count vectors."""
    bags = [_trigram_counts(s) for s in sources]
    vocab = {g: k for k, g in enumerate(set().union(*bags))}
    counts = np.zeros((len(bags), len(vocab)))                 # (n, grams)
    for i, bag in enumerate(bags):
        counts[i, [vocab[g] for g in bag]] = list(bag.values())
    unit = counts / np.linalg.norm(counts, axis=1, keepdims=True)
    return np.clip(unit @ unit.T, 0.0, 1.0)                    # (n, n)


def windowed_diversity(sources: Sequence[str], rng, size: int = 24, draws: int = 12) -> float:
    """Fig. 19's diversity: the mean Vendi score of `draws` random subsamples of `size` sources
    (without replacement) from one window's environments (all of them when there are fewer)."""
    if len(sources) <= size:
        return diversity(list(sources))
    return sum(diversity(rng.sample(list(sources), size)) for _ in range(draws)) / draws


def diversity(sources: Sequence[str]) -> float:
    """Vendi score of one regeneration's environment sources, in [1, n]; 0.0 for no sources."""
    if isinstance(sources, str) or not all(isinstance(s, str) for s in sources):
        raise ValueError("diversity() takes a list of source strings")
    if not sources:
        return 0.0
    lam = np.clip(np.linalg.eigvalsh(similarity_matrix(sources) / len(sources)), 0.0, None)
    lam = lam[lam > 1e-12]
    return float(np.exp(-(lam * np.log(lam)).sum()))  # Vendi = exp(-sum lambda log lambda)
