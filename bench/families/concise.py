"""A family of one-move games for bench/designer_learns.py: a move of at most L words wins.

The designer's one choice is the word limit L, written as a list of eight 0/1 slots that each
allow one more word or not (`allowed = [1, 0, 1, ...]`, L = the sum, 0 .. 8); every other
character of the environment is the same. The agent's skill is brevity: its move is
`\\boxed{up up ...}`, and it wins when the box holds between 1 and L words. A short move wins at
every L, so RL can improve the agent at every setting, but one that has just learnt to stop at
five words still loses at L = 2: the frontier (the L where the agent wins half its plays) moves
down as the agent learns, and a designer that follows it must open fewer and fewer slots.

Why eight slots and not one digit: a digit is one categorical choice, and a GRPO update moves the
probability of the digits it saw, a little each (seen here: p(dial) moved about 0.1 nats per
update at lr 1e-4, and the agent crossed the whole range of digits long before the designer's
choice concentrated). Eight binary slots are eight draws from one shared habit, so every update
shifts the whole distribution of L (a binomial, mean 4 after the warm-up) towards what scored.
Why a bare list: the trials before it broke on their own syntax once RL moved the designer. A
string of eight marks asks a small model to count to eight (plans ran on past their closing
quote); named slots (`dict(a=1, b=0, ...)`) drifted to a repeated name (`d=0, d=1`: a SyntaxError,
validity 1.0 -> 0.13 by step 28 under SPADE). A list of any length is valid code, and a slot
more or less still sets a limit.

Why the unhinted agent starts anywhere in 1 .. 9 words: RL can only reinforce what it samples. A
warm-up agent that never wrote fewer than three words unhinted converged on exactly three (every
play by step 30), its frontier stuck at L = 3, while the hint (one to three words) still won
below it: the designer, scored by regret, then wrote L = 1-2 environments no unhinted play could
win (the agent's return 0.95 -> 0 under SPADE).

The first observation is the same at every L (the limit is hidden; the hint says what wins), so
the agent's reply does not depend on L and one play tells whether it would have won at every L
(`wins`): bench/designer_learns.py reads the agent's whole win-rate curve, and so its frontier,
from the plays of any step, whatever the designer wrote.

Warm-up behaviour (what the supervised phase teaches the one model, bench/designer_learns.py):
  designer  the environment below with each slot 1 or 0 at even odds (L ~ Binomial(8, 1/2));
  hint      HINT, whatever the environment;
  agent     a move of AGENT_WORDS words drawn uniformly, HINTED_WORDS when its first observation
            carries a hint (the hint helps: a shorter move wins at more L).

A family file defines NAME, DIALS (easiest first), HINT, designer_source(rng) -> source (the
warm-up designer's draw), environment(dial) -> source, dial_of(source) -> dial or None,
difficulty(dial) -> int (1 = easiest), wins(action, dial) -> bool (what the environment's step()
pays, for an action as agent.parse_action sends it), and agent_reply(rng, hinted) -> str; its
environments' first observation must not depend on the dial.
"""
from __future__ import annotations

import random
import re

NAME = "concise"
SLOTS = 8                         # the plan's slots: L = 0 .. 8
DIALS = tuple(range(SLOTS, -1, -1))  # the word limit L, easiest (8 words allowed) first
HINT = "Use as few words as you can: one word is best."
AGENT_WORDS = range(1, 10)       # the warm-up agent's move length without a hint, in words
HINTED_WORDS = range(1, 4)       # ... and with one
WORD = "up"                      # the move's word (one token of the tiny tokenizer, " up" too)

TEMPLATE = '''class BriefMoveEnv:
    allowed = [@PLAN@]

    def reset(self, seed=None):
        return "Say your move in the box. Fewer words score.", {}

    def step(self, action):
        boxed = action[:7] == "\\\\boxed{" and action[-1:] == "}"
        n = len(action[7:-1].split()) if boxed else 0
        return "Done.", float(0 < n <= sum(self.allowed)), True, False, {}
'''


def with_plan(bits) -> str:
    """The environment whose slot i allows a word when bits[i] is 1."""
    return TEMPLATE.replace("@PLAN@", ", ".join(map(str, bits)))


def designer_source(rng: random.Random) -> str:
    """The warm-up designer's environment: every slot 1 or 0 at even odds."""
    return with_plan([rng.randint(0, 1) for _ in range(SLOTS)])


def environment(dial: int) -> str:
    """An environment of word limit `dial` (its first `dial` slots open)."""
    return with_plan([1] * dial + [0] * (SLOTS - dial))


def dial_of(source: str) -> int | None:
    """The word limit a designed source sets: the sum of its list, as step() sums it (a list a
    slot short or long still sets one); None without a plan, with an item that is not a whole
    number, or past SLOTS."""
    m = re.search(r"^\s*allowed\s*=\s*\[([^\]]*)\]\s*$", source or "", re.M)
    items = [v.strip() for v in m[1].split(",")] if m else []
    if not items or not all(re.fullmatch(r"\d+", v) for v in items):
        return None
    total = sum(map(int, items))
    return total if total in DIALS else None


def difficulty(dial: int) -> int:
    """1 for the easiest dial (L = 8) up to 9 for the hardest (L = 0, which nothing wins)."""
    return DIALS.index(dial) + 1


def wins(action: str, dial: int) -> bool:
    """What BriefMoveEnv.step pays for `action` at word limit `dial`."""
    boxed = action[:7] == "\\boxed{" and action[-1:] == "}"
    return 0 < (len(action[7:-1].split()) if boxed else 0) <= dial


def agent_reply(rng: random.Random, hinted: bool) -> str:
    """The warm-up agent's reply: a boxed move of a drawn number of words."""
    n = rng.choice(HINTED_WORDS if hinted else AGENT_WORDS)
    return "\\boxed{" + " ".join([WORD] * n) + "}"
