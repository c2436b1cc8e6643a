"""Rewards and regret: what the agent and the Environment Designer are scored by.

SPADE (arXiv 2608.19197), Eq. (3) and the designer reward of the paper's runs.
The agent is rewarded by its episode return. The designer is rewarded for environments at the
agent's learning frontier, measured by the hint-based regret: the same policy plays each new
environment with and without a privileged hint, and the gap between the two mean returns is

    regret(e) = mean_i R_hint(e, s_i) - mean_j R_nohint(e, s_j)                          # Eq. (3)

The paper's runs score the designer with a blend of regret and a solve-rate plateau:

    score(e) = 0.4 * clip(regret(e) / 0.15, 0, 1) + 0.6 * plateau(w(e))
    plateau(w) = 1 on [0.4, 0.6], falling linearly to 0 at 0.15 and 0.85

where w(e) is the environment's mean unhinted return over its whole regeneration epoch.

Symbols (paper -> code):
    R(e, s)        episode return            a number here (agent.episode_return computes it)
    R_hint / R_nohint                        hinted_returns / unhinted_returns
    regret(e)      Eq. (3)                   hint_regret(...)
    w(e)           mean unhinted return      mean_return (a "win rate" elsewhere is the share
                                             of unhinted plays with return > 0)
    score(e)       designer score            designer_score(...)

The ablations (--designer_reward) follow the authors' code: "regret" is their regret_based score
max(0, r_hint - w) with -0.5 for a step timeout, "learning_potential" is |w - mu_slow(skill)| with
per-skill fast/slow EMAs of the epoch mean return, "solve_rate" is plateau(w).

Also here, the logged environment statistics the paper reports: learnable share (per step, and the
paper's slot-weighted 16-step-window figure), reward granularity, zero-variance group share, the
formula-reveal detector (Fig. 9), and diversity (Vendi score per regeneration and over windows).

Deviations from the paper (and from the authors' code):
    1. An environment ended by an environment fault scores 0 (`designer_score(..., faulty=True)`);
       the authors give the agent -1 for a crash and silently drop timeouts. The faulty episodes
       themselves never reach this module: train.py drops them from the agent's batch.
    2. Regret uses common random numbers (both arms play one explicit seed list); that is the
       caller's job, the formula here is unchanged.
    3. The diversity score (Vendi score over token-trigram cosine similarity of the environment
       sources) is our choice; the paper reports diversity qualitatively.

Input policy: every function validates its inputs. NaN / inf raise ValueError, as do empty
arms of Eq. (3). Statistics over an empty step (no environments) return the documented neutral
value 0.0, never NaN, so a log line stays numeric.

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
    """x as a float, or a ValueError naming `name` if it is None, NaN, inf or not a number."""
    if x is None or isinstance(x, bool):
        raise ValueError(f"{name} must be a finite number, got {x!r}")
    value = float(x)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return value


def _finite_list(xs: Iterable, name: str, allow_empty: bool = False) -> list[float]:
    values = [_finite(x, f"{name}[{i}]") for i, x in enumerate(xs)]
    if not values and not allow_empty:
        raise ValueError(f"{name} is empty")
    return values


# ALGO: the designer's reward ---------------------------------------------------------------------

def hint_regret(hinted_returns: Sequence[float], unhinted_returns: Sequence[float]) -> float:
    """Eq. (3): mean hinted return minus mean unhinted return (both arms must be non-empty)."""
    hinted = _finite_list(hinted_returns, "hinted_returns")
    unhinted = _finite_list(unhinted_returns, "unhinted_returns")
    return sum(hinted) / len(hinted) - sum(unhinted) / len(unhinted)  # Eq. (3)


def plateau(w: float, lo: float = 0.4, hi: float = 0.6, ramp: float = 0.25) -> float:
    """1 on [lo, hi], falling linearly to 0 at lo - ramp and hi + ramp (0 beyond)."""
    w = _finite(w, "w")
    if not (lo <= hi and ramp > 0):
        raise ValueError(f"need lo <= hi and ramp > 0, got lo={lo}, hi={hi}, ramp={ramp}")
    # plateau(w) = clip(1 - dist(w, [lo, hi]) / ramp, 0, 1)
    distance = max(lo - w, 0.0, w - hi)
    return max(0.0, 1.0 - distance / ramp)


def designer_score(regret: float | None, mean_return: float | None, mode: str = "blend",
                   regret_scale: float = 0.15, regret_weight: float = 0.4, faulty: bool = False,
                   r_hint: float | None = None, timed_out: bool = False,
                   baseline: float | None = None) -> float:
    """The designer's score of one environment.

    regret:   Eq. (3) at the environment's regeneration step.
    mean_return: w, the environment's mean unhinted return over its regeneration epoch.
    mode:     "blend" (the paper's runs): 0.4 clip(regret / 0.15, 0, 1) + 0.6 plateau(w);
              "regret" (ablation, the authors' regret_based): max(0, r_hint - w), the hinted mean
                  against the whole epoch's unhinted mean, and -0.5 if a step timed out;
              "solve_rate" (ablation): plateau(w);
              "learning_potential" (ablation): |w - baseline|, baseline the skill's slow EMA
                  (`learning_potential_update`). An input the mode does not use may be None.
    faulty:   the environment hit an environment fault; it scores 0, below its skill's mean
              (except a timeout under "regret", which scores the authors' -0.5).
    """
    if mode not in DESIGNER_MODES:
        raise ValueError(f"mode must be one of {DESIGNER_MODES}, got {mode!r}")
    if mode == "regret" and timed_out:
        return STEP_TIMEOUT_PENALTY
    if faulty:
        return 0.0
    if mode == "regret":  # r_hint - mean of all epoch plays, floored at 0
        return max(0.0, _finite(r_hint, "r_hint") - _finite(mean_return, "mean_return"))
    if mode == "solve_rate":
        return plateau(_finite(mean_return, "mean_return"))
    if mode == "learning_potential":  # |w - mu_slow(skill)|
        return abs(_finite(mean_return, "mean_return") - _finite(baseline, "baseline"))
    regret, w = _finite(regret, "regret"), _finite(mean_return, "mean_return")
    # score = 0.4 * clip(regret / 0.15, 0, 1) + 0.6 * plateau(w)
    regret_term = min(1.0, max(0.0, regret / regret_scale))
    return regret_weight * regret_term + (1.0 - regret_weight) * plateau(w)


def learning_potential_update(mu: Sequence[float] | None, r: float,
                              gammas: tuple[float, float] = LP_GAMMAS) -> list[float]:
    """One update of a skill's [mu_fast, mu_slow] with its epoch mean return r (the authors'
    learning-potential trackers): the first value sets both, then mu <- (1 - g) mu + g r."""
    r = _finite(r, "r")
    if mu is None:
        return [r, r]
    return [(1 - g) * m + g * r for m, g in zip(mu, gammas)]


# ALGO: environment statistics (logged, not trained on) -------------------------------------------

def learnable_share(mean_returns: Sequence[float], lo: float = 0.2, hi: float = 0.8) -> float:
    """Share of environments whose mean unhinted return is in [lo, hi]; 0.0 for no environments."""
    rates = _finite_list(mean_returns, "mean_returns", allow_empty=True)
    if not rates:
        return 0.0
    return sum(lo <= w <= hi for w in rates) / len(rates)


def learnable_slot_share(epochs: Sequence[tuple[Sequence[float], int]], lo: float = 0.2,
                         hi: float = 0.8) -> float:
    """The paper's learnable share (Fig. 7) over a window of regeneration epochs: each epoch gives
    the win rates of its valid designer environments and its slot capacity N; unfilled slots
    count as not learnable, so the share is weighted by valid environments:
        share = sum_e #{i : lo <= w_i <= hi} / sum_e N_e          (0.0 for no capacity)"""
    slots = sum(n for _, n in epochs)
    hits = sum(lo <= w <= hi for rates, _ in epochs for w in _finite_list(rates, "win_rates", True))
    return hits / slots if slots else 0.0


# An explicit formula in an observation: a name set equal to an arithmetic expression
# ("y = 3*x + 2", "score = a * b"), or words that announce one.
_FORMULA = re.compile(r"[A-Za-z_]\w*(?:\([^)\n]*\))?\s*=\s*[^=\n]*?[\w)]\s*[-+*/^%]\s*[\w(]"
                      r"|\b(?:formula|the rule is|is computed as|is calculated as)\b", re.I)


def reveals_formula(observation: str) -> bool:
    """Whether a first observation states the formula behind the game (Fig. 9's formula-reveal
    rate is the share of a regeneration's new environments for which this holds)."""
    return bool(_FORMULA.search(observation))


def reward_granularity(env_rewards: Sequence[Iterable]) -> float:
    """Mean number of distinct reward values per environment.

    env_rewards holds one entry per environment: the rewards observed in it, either flat
    ([0.0, 0.5, 1.0]) or per episode ([[0.0, 1.0], [0.5]]). Values are compared after rounding to
    9 decimals so float noise does not invent levels. A binary win/lose environment scores 2 (or
    1 if only one outcome was seen); shaped rewards score more. 0.0 for no environments.
    """
    counts = []
    for i, rewards in enumerate(env_rewards):
        flat = []
        for r in rewards:
            flat.extend(r if isinstance(r, Iterable) else [r])
        levels = {round(v, 9) for v in _finite_list(flat, f"env_rewards[{i}]", allow_empty=True)}
        counts.append(len(levels))
    return sum(counts) / len(counts) if counts else 0.0


def zero_variance_share(groups: Sequence[Sequence[float]]) -> float:
    """Share of GRPO groups whose returns are all equal (they give the agent no gradient).

    0.0 for no groups; an empty group raises.
    """
    if not groups:
        return 0.0
    flat = [_finite_list(g, f"groups[{i}]") for i, g in enumerate(groups)]
    return sum(max(g) == min(g) for g in flat) / len(flat)


# ALGO: diversity of one regeneration -------------------------------------------------------------
# Our choice (deviation 3): the Vendi score (Friedman & Dieng, 2023) of the regeneration's
# environment sources under a token-trigram cosine kernel. Code is split into identifier/number
# words and single punctuation characters; each source becomes a bag of its token trigrams (a
# source shorter than 3 tokens is one "gram", its whole token tuple, so no vector is zero);
# K[i, j] = cosine(counts_i, counts_j), K[i, i] = 1. With lambda the eigenvalues of K / n,
#     Vendi = exp(-sum_k lambda_k * log lambda_k)
# the "effective number of distinct environments": 1 when all sources are identical, n when no two
# share a trigram. Cheap (numpy, no model), deterministic, and sensitive to copy-paste
# environments, which is the failure it exists to catch.

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
        for gram, c in bag.items():
            counts[i, vocab[gram]] = c
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
    if isinstance(sources, str):
        raise ValueError("diversity() takes a list of sources, not one string")
    for i, s in enumerate(sources):
        if not isinstance(s, str):
            raise ValueError(f"sources[{i}] must be str, got {type(s).__name__}")
    if not sources:
        return 0.0
    K = similarity_matrix(sources)
    lam = np.clip(np.linalg.eigvalsh(K / len(sources)), 0.0, None)
    lam = lam[lam > 1e-12]
    # Vendi = exp(-sum lambda log lambda)
    return float(np.exp(-(lam * np.log(lam)).sum()))
