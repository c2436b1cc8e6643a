"""The paper's run statistics of metrics.jsonl: the curriculum's and the returns' (the rest is
computed beside the code it measures: perf/* in telemetry.py, time/* in run.py, regret/* in
train.py, designer/* in designer.py, losses/* in grpo.py).

SPADE (arXiv 2608.19197) judges a run by its curriculum as well as by its losses: the share of
environments at the agent's learning frontier (Fig. 7), how often a game states its own formula
(Fig. 9), how diverse the designer's environments are (Fig. 19), and the agent's returns and win
rates. These are logged, never trained on; regret.py holds what the designer is rewarded by.

    win rate(e)           = #{plays of e with return > 0} / #plays            (0.0 for none)
    learnable share        = #{e : 0.2 <= mean return(e) <= 0.8} / #e          (per step)
    learnable slot share   = sum_epochs #{designer e : 0.2 <= win rate(e) <= 0.8} / sum_epochs N
                             over the epochs of one 16-step window                        (Fig. 7)
    formula-reveal rate    = share of a regeneration's new environments whose first observation
                             states a formula (`reveals_formula`)                         (Fig. 9)
    diversity              = Vendi score of a regeneration's sources; the window's is the mean of
                             12 draws of 24 sources of a 40-step window                  (Fig. 19)

Symbols: e an environment, N the designer slots of an epoch (a regeneration's environments, R
steps), w(e) the mean unhinted return. `hist` (train.State.hist, checkpointed) carries the open
windows: "epochs" ([epoch start, win rates, slots]) and "sources".

Deviations from the paper (and from the authors' code):
    1. Diversity is the Vendi score over token-trigram cosine similarity of the sources (our
       choice; the paper reports diversity qualitatively).
    2. Each rank draws the windowed diversity's subsamples from its own environments and the
       ranks' values are averaged (Fig. 19 subsamples the whole run's window).

Dependencies: standard library + numpy only. Test: `pytest tests/test_metrics.py`.
"""
from __future__ import annotations

import math
import random
import re
from collections import Counter
from collections.abc import Sequence

import numpy as np

# Algorithm 1's phases in train.train's order (each entered with train.phase, then "log"): the
# step's time/<phase>_s is the wall time from a phase's start to the next one's, time/step_s the
# whole step's (log included)
PHASES = ("regenerate", "play", "regret", "score", "update", "sync", "memory")


def _finite_list(xs, name: str) -> list[float]:
    """xs as floats, or a ValueError naming the first entry that is None, a bool, NaN or inf."""
    out = []
    for i, x in enumerate(xs):
        if x is None or isinstance(x, bool) or not math.isfinite(float(x)):
            raise ValueError(f"{name}[{i}] must be a finite number, got {x!r}")
        out.append(float(x))
    return out


# the agent's plays, every step --------------------------------------------------------------

def win_rate(returns) -> float:
    """The share of plays with return > 0 (0.0 without plays): memory.win_rate, the win rate the
    memory records, repeated here so that this leaf imports nothing of the repository."""
    return sum(r > 0 for r in returns) / len(returns) if returns else 0.0


def episode_metrics(episodes) -> dict:
    """The step's agent/* metrics: unhinted returns, turns, tokens, statuses; hinted returns."""
    plain = [ep for ep in episodes if not ep.hinted]
    m = {"agent/episodes": len(plain)}
    if plain:
        m["agent/return_mean"] = sum(ep.ret for ep in plain) / len(plain)
        m["agent/turns_mean"] = sum(ep.turns for ep in plain) / len(plain)
        m["agent/tokens_mean"] = sum(len(ep.token_ids) for ep in plain) / len(plain)
        turns = sum(ep.turns for ep in plain)
        m["agent/masked_reply_share"] = sum(ep.masked_replies for ep in plain) / max(1, turns)
        for status in sorted({ep.status for ep in plain}):
            m[f"agent/status/{status}"] = sum(ep.status == status for ep in plain) / len(plain)
    hinted = [ep.ret for ep in episodes if ep.hinted]
    if hinted:
        m["agent/hinted_return_mean"] = sum(hinted) / len(hinted)
    return m


def env_metrics(pool, episodes) -> dict:
    """This step's env/* metrics of the unhinted plays that did not fault (README, Metrics)."""
    by_env, unhinted, rewards = {e.env_id: e for e in pool}, {}, {}
    for ep in episodes:
        if not ep.hinted:
            rewards.setdefault(ep.env_id, []).extend(ep.rewards)
            if ep.status != "env_error":
                unhinted.setdefault(ep.env_id, []).append(ep.ret)
    m = {"env/pool_size": len(pool), "env/faulty": sum(e.faulty for e in pool)}
    if unhinted:
        wins = {k: win_rate(v) for k, v in unhinted.items()}
        m["env/learnable_share"] = learnable_share([sum(v) / len(v) for v in unhinted.values()])
        m["env/win_rate"] = sum(wins.values()) / len(wins)
        m["env/zero_variance_share"] = zero_variance_share(list(unhinted.values()))
        m["env/reward_granularity"] = reward_granularity([rewards[k] for k in unhinted])
        for skill in sorted({by_env[k].skill for k in wins}):
            ks = [k for k in wins if by_env[k].skill == skill]
            m[f"env/win_rate/{skill}"] = sum(wins[k] for k in ks) / len(ks)
    return m


def learnable_share(mean_returns: Sequence[float], lo: float = 0.2, hi: float = 0.8) -> float:
    """Share of environments whose mean unhinted return is in [lo, hi]; 0.0 for no environments."""
    rates = _finite_list(mean_returns, "mean_returns")
    return sum(lo <= w <= hi for w in rates) / len(rates) if rates else 0.0


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


# Fig. 7, the learnable share over each 16-step window of epochs -----------------------------

def learnable_slot_share(epochs: Sequence[tuple[Sequence[float], int]], lo: float = 0.2,
                         hi: float = 0.8) -> float:
    """The paper's learnable share (Fig. 7) over a window of regeneration epochs, each given as
    the win rates of its valid designer environments and its slot capacity N (unfilled slots
    count as not learnable):  share = sum_e #{i : lo <= w_i <= hi} / sum_e N_e  (0.0 for no N)"""
    slots = sum(n for _, n in epochs)
    hits = sum(lo <= w <= hi for rates, _ in epochs for w in _finite_list(rates, "win_rates"))
    return hits / slots if slots else 0.0


def epoch_learnable(hist: dict, pool, epoch_start: int, n_slots: int, window: int = 16) -> dict:
    """Fig. 7's learnable share: a finished epoch adds the win rates of its designer environments
    (share of its unhinted plays with return > 0) and its slot count; the share is over the
    epochs of its 16-step window so far (complete at the window's last epoch)."""
    rates = [win_rate(e.returns) for e in pool if e.origin == "designer"]
    hist["epochs"] = [x for x in hist["epochs"] if x[0] // window == epoch_start // window]
    hist["epochs"].append([epoch_start, rates, n_slots])
    share = learnable_slot_share([(r, n) for _, r, n in hist["epochs"]])
    return {"env/learnable_slot_share": share}


# Figs. 9 and 19, at each regeneration -------------------------------------------------------

def regen_figures(step, pool, regen: bool, episodes, hist: dict, steps: int, rng: random.Random,
                  gather=list, window: int = 40) -> dict:
    """At a regeneration, the Vendi diversity of the new environments of every rank (`gather`, a
    collective) and Fig. 9's formula-reveal rate (their first observation); Fig. 19's diversity
    over each 40-step window's new environments."""
    m, fresh, first = {}, {}, {}
    if regen:
        fresh = {e.env_id: e for e in pool if e.origin == "designer"}
        m["designer/diversity"] = diversity(gather([e.source for e in fresh.values()]))
    for ep in episodes:
        if ep.env_id in fresh and not ep.hinted and ep.messages:
            first.setdefault(ep.env_id, ep.messages[0]["content"])
    if first:
        m["designer/formula_reveal_rate"] = sum(map(reveals_formula, first.values())) / len(first)
    hist["sources"] += [e.source for e in fresh.values()]
    if (step + 1) % window == 0 or step + 1 == steps:
        if hist["sources"]:
            m["designer/diversity_window"] = windowed_diversity(hist["sources"], rng)
        hist["sources"] = []
    return m


# An explicit formula in an observation: a name set equal to an arithmetic expression
# ("y = 3*x + 2", "score = a * b"), or words that announce one.
_FORMULA = re.compile(r"[A-Za-z_]\w*(?:\([^)\n]*\))?\s*=\s*[^=\n]*?[\w)]\s*[-+*/^%]\s*[\w(]"
                      r"|\b(?:formula|the rule is|is computed as|is calculated as)\b", re.I)


def reveals_formula(observation: str) -> bool:
    """Whether a first observation states the formula behind the game (Fig. 9's formula-reveal
    rate is the share of a regeneration's new environments for which this holds)."""
    return bool(_FORMULA.search(observation))


# Diversity (deviation 1) --------------------------------------------------------------------------
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
