"""The Environment Designer: skills, corpus grounding, designer prompts, reply parsing, hints.

SPADE (arXiv 2608.19197; the designer role, Algorithm 1 step 1) makes the policy write
complete multi-turn environments as Python classes. Each regeneration picks the active skills by round
robin, grounds every attempt in a document sampled from a corpus, shows the environment memory
(memory.py), extracts the code from the reply, validates it in the sandbox (up to 5 attempts per
slot, a fresh document each time; invalid attempts are rejection-sampled away, never trained on),
and then asks the same policy for a privileged hint used by the hint-based regret, Eq. (3).

    round robin:  e = step // R,  start = (e * k) mod n,  active = S[start], ..., S[start + k - 1]
    slot i of a regeneration gets skill active[i mod k]
    hinted first observation = f"{observation}\\n\\nHINT: {hint}"

Symbols (paper -> code):
    S, n (skills)              GAME_SKILLS / TOOL_SKILLS, len(skills)
    k (active per regen)       per_regen  (3 for games, 6 for tool use)
    R (regeneration interval)  interval   (4 for games, 8 for tool use)
    N (environments per regen) len(skills_for_slots) (24 in the paper)
    d (corpus document)        Document
    h(e) (privileged hint)     Proposal.hint

Deviations from the paper and from the authors' code:
    1. The environment class is the LAST module-level class whose name ends in "Env" (the
       sandbox's report, when it names a class, takes precedence).
    2. Code extraction takes the first ```python (or ```py) fence, then an untagged ``` fence, then
       the whole reply; an unclosed fence (a reply cut at the token cap) runs to the end.
    3. Brace repair fixes only f-string fields that do not parse on their own (e.g.
       f"answer \\boxed{<move>}") by doubling their braces, at most 3 rounds, and keeps the result
       only if `ast` parses it. Fields that parse but fail at run time are the sandbox's business.
    4. A reply that hit the token cap and does not parse is rejected as "truncated", not "syntax".
    5. Tool-use prompts carry the authors' content in our words (their six tool skills with a
       category and four example tasks each, the domain rotation, task variants weighted 3:2:1:1,
       distractor tools, an enum parameter, no system message; a plain-text hint prompt with their
       rules: done only at the end, ask / decline, no concrete values). Differences: the
       environment declares (instruction, predicate) pairs and the ToolEnv base class advances
       them (authors: each tool calls its own `_advance_if_done`), and the document comes last.
    6. The solvability check of tool-use environments is executable (sandbox replays solution())
       where the authors used an LLM self-audit; the prompt tells the designer about it.
    7. A hint is capped at 100 words (the prompt asks for fewer); an empty hint becomes None and
       the hinted arm then equals the unhinted one.
    8. `validate` is retried up to twice when it raises (the sandbox raises only for
       infrastructure faults; README, "Running model-written code safely"); a third failure
       propagates to the trainer.
    9. The games prompts (the authors' content in our words; the no-corpus ablation has its own,
       as theirs) add one demand: all randomness from `random.Random(seed)`, because validation
       checks that a seed replays the same game (sandbox.py). The no-corpus reference example is
       a short description, not the authors' full trading-game listing.
   10. Hint calls use the designer's top-p 0.95 / top-k 20 (the authors pass none: their
       adapter's top-p 0.9, top-k off).

Dependencies: standard library only.
Test: `pytest tests/test_designer.py`.
"""
from __future__ import annotations

import ast
import json
import logging
import random
import re
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

log = logging.getLogger(__name__)

# The sampling settings of both designer calls (temperature, top-p, top-k, token caps) are
# train.SpadeArgs fields citing the paper; train.py binds them into the generate callables.
HINT_MAX_WORDS = 100
MAX_ATTEMPTS = 5                                  # attempts per slot (paper)
CORPUS_SEED = 42                                  # document sampler seed (paper)
CORPUS_MAX_WORDS = {"games": 6000, "tool": 4000}  # words kept per document (paper)
REPAIR_ROUNDS = 3
MAX_FIELD_CHARS = 400        # longer "fields" are left alone
REPAIR_BUDGET = 200_000      # characters of field probing per round; beyond it a reply is not repaired
VALIDATE_RETRIES = 2
SETTINGS = ("games", "tool")

# ----------------------------------------------------------------------------------------------
# ALGO: skills and the round-robin curriculum


@dataclass(frozen=True)
class Skill:
    name: str
    description: str
    examples: tuple[str, ...]


# The authors' skill descriptions; `examples` are the game ideas the NO-CORPUS prompt samples
# three of (the corpus-grounded prompt shows only the name and the description).
GAME_SKILLS = (
    Skill("Mathematical Reasoning", "Solving mathematical problems and equations",
          ("balancing a set of equations by changing their coefficients turn by turn",
           "a number maze whose cells apply arithmetic operations: pick a route that ends on the target",
           "an auction of items with hidden values, bidding from a limited budget",
           "stacking blocks under weight limits, where the placement order matters")),
    Skill("Logical Deduction", "Drawing conclusions from given premises and rules",
          ("a detective case: question suspects, search the scenes, weigh the evidence, then accuse",
           "a Cluedo-like hunt: walk between rooms, collect evidence cards, infer who, what and where",
           "a logic-grid puzzle filled in by asking yes/no questions over several turns",
           "an escape room whose objects, examined in turn, each give the clue to the next lock")),
    Skill("Spatial Reasoning", "Understanding spatial relationships and mental rotation",
          ("a 2D maze with dead ends and traps: find the exit",
           "Sokoban: push crates onto their targets in a grid warehouse",
           "placing furniture in rooms so that every spatial constraint holds",
           "steering a robot around obstacles one direction per turn on limited fuel")),
    Skill("Pattern Recognition", "Identifying patterns in sequences, numbers, or text",
          ("rooms on a grid hold fragments of a pattern: gather enough of them to decode a message",
           "Mastermind: guess a hidden colour code from right-place / wrong-place / absent feedback",
           "a small minesweeper: uncover and flag cells, reasoning from the number clues",
           "break a cipher while exploring a map where each place reveals one letter mapping")),
    Skill("Optimization", "Finding optimal solutions under constraints",
          ("a knapsack filled online: items arrive one at a time, take or skip each under a weight cap",
           "assigning jobs to machines over several turns to minimise the total completion time",
           "re-balancing an investment portfolio each round as market conditions shift",
           "configuring factory lines turn by turn to maximise output before a deadline")),
    Skill("Causal Inference", "Understanding cause-effect relationships",
          ("an experiment: pick which variables to vary each turn and infer the hidden causal rule",
           "troubleshooting a broken machine by testing its parts one after another",
           "an epidemic: apply an intervention per turn, watch its effect, locate the source",
           "debugging a circuit by toggling switches and measuring outputs to find the bad gate")),
)

TOOL_SKILLS = (  # the authors' six tool skills: their categories and example tasks, in our words
    Skill("API Orchestration", "stateful operations: a chain of tool calls that change the state one after another",
          ("go to a folder, make a subfolder and move files into it",
           "check a balance, transfer money, then confirm the new balance",
           "search the stock, reserve items, confirm the reservation and issue an invoice",
           "list flights, book one, add the passenger's details and confirm")),
    Skill("Data Retrieval", "query then act: find the facts with lookup tools first, then act on them exactly",
          ("list a folder, find the right file, read it and pull out one value",
           "find a user by name, fetch their orders and pick the most recent one",
           "read the current settings, work out which must change and update those",
           "query records that match a condition, aggregate them and report the figure")),
    Skill("State Modification", "mutation chains: state changes in sequence, each depending on the state before it",
          ("create an account, set its permissions, add it to a group and check the membership",
           "walk a file tree, build a folder structure, then move and rename files",
           "bring up a vehicle's systems (engine, doors, fuel) before giving driving commands",
           "set up a portfolio: check prices, place orders, confirm the positions")),
    Skill("Error Recovery", "robustness: handle failing tools, check the state before acting, retry with a fix",
          ("a move fails with 'not found'; search for the right path and retry",
           "an operation is refused for lack of permission; raise access and retry",
           "check whether a folder exists before creating it and cope with 'already exists'",
           "validate the inputs against the current state before a destructive call")),
    Skill("Tool Selection", "decision making: pick the right tool among alternatives from the current state",
          ("check where you are, then either navigate or act in place",
           "look up an item's type, then use the processing tool made for that type",
           "read a file's format, then choose the matching parser or converter",
           "check whether a resource exists, then choose between create and update")),
    Skill("Multi-Step Workflows", "sequential planning: ordered steps where later ones use earlier results",
          ("files: list, navigate, make a folder, move files, verify, report",
           "orders: search the catalog, check stock, reserve, pay, confirm, notify",
           "setup: check status, configure, enable, test, verify, log the result",
           "data: connect, query, filter, transform, write, validate the output")),
)

TWO_SKILLS = tuple(s for s in GAME_SKILLS if s.name in ("Mathematical Reasoning", "Pattern Recognition"))
SKILLS = {s.name: s for s in GAME_SKILLS + TOOL_SKILLS}


def active_skills(step: int, skills: Sequence[Skill | str], per_regen: int, interval: int) -> list[str]:
    """Names of the k skills active at `step` (round robin)."""
    names = [s.name if isinstance(s, Skill) else s for s in skills]
    n, k = len(names), per_regen
    if not 1 <= k <= n or interval < 1:
        raise ValueError(f"need 1 <= per_regen <= {n} and interval >= 1, got {k} and {interval}")
    epoch = step // interval
    start = (epoch * k) % n
    return [names[(start + i) % n] for i in range(k)]


def slot_skills(active: Sequence[str], n_slots: int) -> list[str]:
    """Slot i of a regeneration gets skill active[i mod k]."""
    return [active[i % len(active)] for i in range(n_slots)]


# ----------------------------------------------------------------------------------------------
# INFRA: the grounding corpus


@dataclass(frozen=True)
class Document:
    doc_id: str       # the line's "id" field if it has one, else "line <n>" (1-based)
    text: str         # possibly truncated, with a note saying so
    truncated: bool
    title: str = ""   # the line's "title" or "url" field, else its first words (report.py's cards)


def truncate_words(text: str, max_words: int) -> tuple[str, bool]:
    """Keep the first `max_words` whitespace-separated words (original spacing kept) plus a note."""
    for i, m in enumerate(re.finditer(r"\S+", text)):
        if i == max_words:
            note = f"\n\n[Document truncated: only its first {max_words:,} words are shown.]"
            return text[:m.start()].rstrip() + note, True
    return text, False


class Corpus:
    """Documents from a JSONL file (`text` or `orig_doc` per line) and a seeded sampler.

    Build it once per run and keep it (checkpoint `state_dict()`): a fresh Corpus restarts the
    sampler at its seed and would hand every regeneration the same documents.
    """

    def __init__(self, path: str | Path, *, max_words: int = CORPUS_MAX_WORDS["games"],
                 seed: int = CORPUS_SEED):
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"corpus {path} not found: pass a JSONL file with one "
                                    "{\"text\": ...} object per line (data/corpus.jsonl ships one; "
                                    "a FineWeb-Edu sample is the paper-scale choice)")
        self.path, self.max_words = path, max_words
        self.documents: list[Document] = []
        self.skipped = 0  # lines that were not JSON objects with a non-empty text
        with path.open(encoding="utf-8", errors="replace") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    row = None
                text = (row.get("text") or row.get("orig_doc")) if isinstance(row, dict) else None
                if not isinstance(text, str) or not text.strip():
                    self.skipped += 1
                    continue
                doc_id = str(row["id"]) if row.get("id") is not None else f"line {n}"
                words = text.split()
                title = str(row.get("title") or row.get("url")
                            or " ".join(words[:12]) + (" ..." if len(words) > 12 else ""))[:200]
                self.documents.append(Document(doc_id, *truncate_words(text.strip(), self.max_words), title))
        if self.skipped:
            log.warning("corpus %s: skipped %d unreadable or empty lines", path, self.skipped)
        if not self.documents:
            raise ValueError(f"corpus {path} has no usable documents ({self.skipped} lines skipped)")
        self.rng = random.Random(seed)

    @classmethod
    def load(cls, path: str | Path, *, max_words: int = CORPUS_MAX_WORDS["games"],
             seed: int = CORPUS_SEED) -> "Corpus":
        """Same as the constructor; reads as what it does at the call site."""
        return cls(path, max_words=max_words, seed=seed)

    def __len__(self) -> int:
        return len(self.documents)

    def sample(self) -> Document:
        return self.rng.choice(self.documents)

    def state_dict(self) -> dict:
        """The sampler state, JSON-serialisable, for checkpoints."""
        version, internal, gauss = self.rng.getstate()
        return {"rng": [version, list(internal), gauss]}

    def load_state_dict(self, state: dict) -> None:
        version, internal, gauss = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss))


# ----------------------------------------------------------------------------------------------
# ALGO: the designer prompts

TOOL_DOMAINS = ("retail orders (orders, items, refunds, shipping)",
                "travel booking (flights and hotels: search, reserve, pay, cancel)",
                "telecom accounts (plans, lines, billing, data add-ons)",
                "personal banking (accounts, transfers, cards, invoices)",
                "a calendar assistant (events, invitations, reminders)",
                "a file system (files, folders, moving, copying, searching)",
                "an online shop (catalog, cart, checkout, coupons)",
                "customer-support tickets (tickets, status, assignment, notes)",
                "smart-home control (lights, thermostat, locks, scenes)",
                "a project tracker (tasks, assignees, status, due dates)")
TOOL_VARIANTS = {
    "execute": "The plain case: each instruction asks for something the tools can do directly. "
               "The assistant must call the right tools in the right order; each predicate checks "
               "the state those calls produce.",
    "read_then_write": "At least one instruction makes the assistant read the state first, decide "
                       "by a condition over what it read (for example every order above $100, or "
                       "every line past its data cap), and only then write. Its predicate checks "
                       "that exactly the qualifying records changed, not merely that a tool ran.",
    "missing_parameter": "At least one instruction refers to a value the user does not give (for "
                         "example 'cancel my latest order' without an order id). The assistant "
                         "must find it with a read tool before acting. The write tool returns an "
                         "error for any wrong or guessed value, so a made-up argument can never "
                         "satisfy the predicate.",
    "decline": "Exactly one instruction asks for something no tool of this domain can do (say, "
               "tomorrow's weather in a retail backend). Provide a tool decline_request with one "
               "required string parameter, reason; it records the refusal in the state, and that "
               "instruction's predicate holds only once decline_request has been called. No other "
               "tool may plausibly serve that request.",
}
# The authors' rotation: the common variants more often, the rarer benchmark cases once each.
TOOL_VARIANT_WEIGHTS = {"execute": 3, "read_then_write": 2, "missing_parameter": 1, "decline": 1}

GAMES_SYSTEM = ("You are an expert Python programmer and game designer. You build interactive, "
                "multi-turn text games in which the player takes a sequence of decisions and every "
                "action changes the state of the game.")

# ALGO: the corpus-grounded games prompt: the authors' content (interactive contract, "do not"
# rules, grounding, skeleton with max_turns=12 and solution(), robustness, self-verification).
GAMES_SPEC = r"""The environment MUST be interactive and multi-turn, not a question-and-answer quiz.

How the agent acts:
- Each turn the agent sends ONE action written as \boxed{<action>}, e.g. \boxed{open valve B} or
  \boxed{measure node 4}. In step(), take the text out with re.search(r'\\boxed\{(.+?)\}', action)
  and treat it as a COMMAND that changes the environment, never as a final answer graded once.
- step() updates the state from the command and returns a NEW observation of the changed state.

What makes it multi-turn (all required):
- One action cannot reach the goal: it takes a sequence of actions (probe to uncover hidden
  information, then act on it; or move the state step by step towards a target).
- Hidden state: reset() does not show everything; the agent learns it by acting over turns.
- Partial reward for progress; terminated=True only once the goal is reached.
- Every observation shows the updated state and reminds the agent to answer with \boxed{<action>}.

Do NOT (each of these turns it back into single-shot question answering):
- Do not read one \boxed{answer}, grade it and terminate: \boxed carries a per-turn command.
- Do not state the whole problem at reset() and then just check one submitted value.
- Do not repeat the same static task every turn with nothing but "wrong, try again" as feedback.

Grounding: playing must require carrying out a concept or technique from the document, step by
step. If the document describes an algorithm, the agent EXECUTES it one step per turn; if it
describes a system, the agent OPERATES that system over the turns. The game never mentions the
document (no "according to the text"): it stands on its own.

Interface (\boxed wraps each turn's command):
```python
import random
import re


class DescriptiveInteractiveEnv:
    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns
        self.turn_count = 0
        ...                                  # every attribute is initialised here
        self.reset()

    def reset(self, seed=None):
        self.rng = random.Random(seed)       # all randomness from this rng: a seed replays a game
        self.turn_count = 0
        ...                                  # hidden state and a goal that needs several actions
        return observation, {}               # situation, available actions, the \boxed format

    def step(self, action):
        self.turn_count += 1
        truncated = self.turn_count >= self.max_turns
        m = re.search(r'\\boxed\{(.+?)\}', action)
        cmd = (m.group(1) if m else action).strip()
        ...                                  # parse cmd, update the state, describe the new state
        return observation, reward, terminated, truncated, {}

    def solution(self):
        ...                                  # a reference action sequence that solves the game

    def close(self):
        pass
```

Reward: stays within [0, 1]; progress earns less than 1.0, full success earns 1.0.

Robustness (the usual reasons an environment fails to load or crashes):
- Braces: inside f-strings and .format() a literal brace is doubled, so an f-string prints the
  format as \boxed{{<action>}}.
- Initialise every attribute in __init__ before reset() is called.
- Standard library only (random, math, re, ...); import every name you use.
- Every path of step() returns the 5-tuple (str, float, bool, bool, dict); info is always a dict.
- An unknown or garbage command never crashes: answer with a helpful observation and reward 0.0.
- Never divide by something that can be zero; never store data in self.solution (that hides the
  solution() method): use self._solution.

Self-verification before you answer:
- Trace two different action sequences from reset(seed=0): does the observation change with the
  actions? If it never does, the game is not interactive: fix it.
- Does \boxed carry a per-turn command that evolves the state, not a final answer that ends it?
- Is the partial reward for progress, and within [0, 1]?"""

# ALGO: the no-corpus ablation's prompt: the authors' separate multi-turn prompt (per-skill
# ideas, six archetypes, six failure modes, optimal play in max_turns/2 .. 3*max_turns/4 turns).
NO_CORPUS_SPEC = r"""What makes a good multi-turn game: think of text adventures, board games and strategy
games, where the world changes with every action. For example:
- exploration: walk through rooms on a grid, find keys, open doors, reach the exit;
- trading: buy cheap and sell dear over rounds of moving prices;
- survival: keep health, food and tools up while exploring; bad choices are fatal;
- investigation: question suspects, search places, put the clues together;
- tower defense: place defenses, then waves arrive and the strategy must adapt;
- crafting: gather materials and combine them in the right order to build something.

Failure modes to avoid:
- A puzzle the player answers and simply retries on failure: that is one turn with retries.
- Raising or lowering a number until it hits a target: a linear search, no decisions.
- Only one sensible action each turn: if the best path is obvious there is no strategy.
- A game won in 1-3 turns: too short to train multi-turn play.
- One-turn puzzles dressed up as a journey ("walk to the forest, solve 2+3, take the wood").
- input(): never. The action passed to step() is the player's whole reply; parse it from there.

Design requirements:
- The world has state that every action changes (positions, inventory, health, money, ...).
- Each turn offers two or more genuinely different actions, and some are better than others:
  a wrong choice wastes turns or does harm. Random play should lose most of the time.
- The game lasts at most {max_turns} turns; set budgets and pacing so that optimal play wins in
  about {lo}-{hi} turns.
- A clear WIN condition, and preferably a LOSE condition too.

Actions: the player wraps every action in \boxed{{action}}; step() reads what is inside. Every
observation lists the available actions (e.g. Actions: \boxed{{go north}}, \boxed{{take key}}). A
reply without \boxed{{}} gets a format reminder and does not end the game.

Observations show (1) the current state, (2) what the last action did, (3) the available
actions, (4) progress such as "Turn 3/{max_turns} | HP 7/10 | Items: key". The first observation
(from reset) gives the rules, the goal and the starting state.

Reward: a win gives 1.0 with terminated=True; a loss 0.0 with terminated=True; other turns 0.0;
running out of turns without winning 0.0 with truncated=True.

Interface:
```python
import random
import re


class DescriptiveNameEnv:
    def __init__(self, max_turns={max_turns}, **kwargs):
        self.max_turns = max_turns
        self.turn_count = 0
        ...                                  # every state variable is initialised here
        self.reset()

    def reset(self, seed=None):
        self.rng = random.Random(seed)       # all randomness from this rng: a seed replays a game
        self.turn_count = 0
        ...                                  # build a random world
        return observation, {{}}

    def step(self, action):
        self.turn_count += 1
        m = re.search(r'\\boxed\{{([^}}]*)\}}', action)
        if not m:
            return "Reply with \\boxed{{action}}.", 0.0, False, False, {{}}
        cmd = m.group(1).strip().lower()
        ...                                  # update the state, check win and loss
        truncated = self.turn_count >= self.max_turns
        return observation, reward, terminated, truncated, {{}}

    def close(self):
        pass
```

A reference for the pattern (yours must be a DIFFERENT game): a market game in which the price
drifts with a hidden trend; the player has 100 gold and must reach 200 within the turn budget;
each turn it may \boxed{{buy N}}, \boxed{{sell N}} or \boxed{{wait}}; the observation shows price,
gold, stock, the price history and "Turn t/{max_turns}"; reaching the target wins (1.0), going
broke loses (0.0).

Robustness: initialise every attribute in __init__; never divide by a possible zero; return {{}}
as info; every path of step() returns (str, float, bool, bool, dict); never store data in
self.solution (use self._solution); double literal braces inside f-strings and .format(), e.g.
f"Answer as \\boxed{{{{move}}}}"."""


def games_prompt(skill: Skill, document: Document | None, rng: random.Random | None = None,
                 max_turns: int = 25) -> str:
    """The games designer's user message: corpus-grounded (the paper's runs) or the no-corpus
    ablation's own prompt, which alone carries game ideas (3 sampled from the skill's 4)."""
    if document is not None:
        return ("Below is a reference document. Build an INTERACTIVE, MULTI-TURN Python game "
                "environment grounded in a concept or technique from it.\n\n<REFERENCE_DOCUMENT>\n"
                f"{document.text}\n</REFERENCE_DOCUMENT>\n\n{GAMES_SPEC}\n\nTarget skill: "
                f"{skill.name} ({skill.description}). DIFFICULTY: medium: the goal should need 3 "
                "or more interaction steps.\n\nWrite the complete Python code in a ```python block.")
    ideas = (rng or random.Random(0)).sample(skill.examples, min(3, len(skill.examples)))
    return (f"Write an interactive multi-turn text game, as a Python class, that exercises "
            f"{skill.name} ({skill.description}).\n\nGame ideas for {skill.name} (take one or "
            "invent a similar one):\n" + "\n".join(f"- {e}" for e in ideas) + "\n\n"
            + NO_CORPUS_SPEC.format(max_turns=max_turns, lo=max_turns // 2, hi=max_turns * 3 // 4)
            + "\n\nWrite the complete Python code in a ```python block.")


TOOL_INTERFACE = r"""## Interface
`ToolEnv` is provided by the runtime: do not import it and do not define it. Subclass it:
```python
class OrderDeskEnv(ToolEnv):               # the class name must end in "Env"
    TOOLS = [{"name": "lookup_order", "description": "Look up an order by id.",
              "parameters": {"type": "object",
                             "properties": {"order_id": {"type": "string"}},
                             "required": ["order_id"]}},
             {"name": "set_status", "description": "Change the status of an order.",
              "parameters": {"type": "object",
                             "properties": {"order_id": {"type": "string"},
                                            "status": {"type": "string",
                                                       "enum": ["pending", "shipped", "cancelled"]}},
                             "required": ["order_id", "status"]}},
             ...]
    def setup(self, rng):                  # rng: random.Random seeded by reset(seed)
        self.state = {...}                 # the hidden backend state, built from rng only
        self.instructions = [("Find the status of order 17.", lambda s: s["found"]), ...]  # 3-5
    def tool_lookup_order(self, order_id: str) -> str:
        ...                                # one method tool_<name> per entry of TOOLS
    def solution(self) -> list[dict]:      # reference calls, computed from self.state
        return [{"name": "lookup_order", "arguments": {"order_id": "17"}}, ...]
```
What ToolEnv provides (do not override these):
- `__init__(self, max_turns=10)`; `reset(seed)` calls `setup(rng)` and returns (the first
  instruction, {"tools": [...]}); `tools()` exports TOOLS as function schemas.
- `step(action)`: the action holds `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`
  blocks (one or more) or an `<answer>...</answer>`. Each call is dispatched with
  `call(name, arguments) -> str` (errors come back as text); the observation is the outputs joined
  by newlines, reward 0.0. Tool calls are free: only answers and malformed turns count toward
  `max_turns`. A call that completes the current instruction gets the next instruction appended to
  its output; after the last instruction, a line telling the assistant to submit
  `<answer>done</answer>`. That answer, once every instruction is done, ends the episode with
  reward 1.0; an earlier or different answer gets reward 0.0 and feedback naming the pending
  instruction, and play continues. A turn with neither a call nor an answer is malformed:
  reward -0.1 and a format reminder. After `max_turns` answers or malformed turns the episode is
  truncated.
Solvability is checked by running your code: for seeds 0, 1 and 2, `solution()` is replayed one
call per step from `reset(seed)`; every instruction must complete in order and
`<answer>done</answer>` must then earn 1.0. Predicates take the state, never raise, and are all
False right after reset."""

TOOL_REQUIREMENTS = r"""## Interaction requirements
- A realistic user goal in this domain (search, book, order, update, cancel, transfer, schedule),
  as in tau2-bench, BFCL or ACEBench; not an exam or a puzzle about the reference document.
- The goal arrives as 3-5 short, atomic instructions (1-2 sentences each), revealed one at a time.
  Never describe the whole workflow up front, and never name tools, state keys or other
  implementation details in an instruction.
- 3-8 tools, including 1-2 DISTRACTOR tools: plausible in this domain but wrong for these
  instructions, so the assistant has to choose the right tool among similar ones.
- At least one tool parameter takes enumerated values: an "enum" list in its schema, and the
  parameter listed in "required".
- Each instruction needs a few tool calls (no more than 4-8). Ids and values live in the hidden
  state and must be looked up, never guessed; every value a predicate needs is stated in the
  instruction or returned by some tool. Tool outputs are short, informative text (JSON is fine).
- A predicate checks the change its instruction asks for, reading the state in the shape the tools
  write it (search a list of dicts by field, not with `in` on a string). For a read-only
  instruction, the read tool records that it ran and the predicate checks that record.
- Tools validate their arguments and return an error message as text instead of raising.
- Instructions never reveal the solution and never mention the reference document."""

TOOL_ROBUSTNESS = r"""## Robustness rules
- Standard library only (math, random, re, json, itertools, collections, functools, heapq,
  string); no files, network, subprocesses, input() or printing.
- Build all state in `setup` from the given rng, so the same seed gives the same episode.
- Every tool method accepts exactly the parameters its schema declares and returns a str.
- Inside f-strings, double literal braces: f"Order {oid}: status {{shipped}}"."""


def tool_task(rng: random.Random) -> tuple[str, str]:
    """One of the ten domains (uniform) and one task variant (weights 3:2:1:1, the authors') for a
    tool-use prompt."""
    rotation = [v for v, w in TOOL_VARIANT_WEIGHTS.items() for _ in range(w)]
    return rng.choice(TOOL_DOMAINS), rng.choice(rotation)


def _skill_section(skill: Skill) -> str:
    ideas = "\n".join(f"- {e}" for e in skill.examples)
    return (f"## Target skill\n{skill.name}: {skill.description}.\nIdeas for inspiration (invent "
            f"your own):\n{ideas}\nDifficulty: medium, the goal needs 3 or more interaction steps.")


def designer_messages(skill: str | Skill, *, setting: str = "games", document: Document | None = None,
                      memory_block: str = "", task: tuple[str, str] | None = None,
                      rng: random.Random | None = None) -> list[dict]:
    """The designer chat for one attempt; `task` = (domain, variant) is required for tool use;
    `rng` samples the no-corpus prompt's game ideas. The memory block comes last."""
    skill = SKILLS[skill] if isinstance(skill, str) else skill
    if setting == "games":
        user = "\n\n".join(p for p in (games_prompt(skill, document, rng), memory_block) if p)
        return [{"role": "system", "content": GAMES_SYSTEM}, {"role": "user", "content": user}]
    doc = (f"<REFERENCE_DOCUMENT>\n{document.text}\n</REFERENCE_DOCUMENT>" if document else None)
    ask = "Write the complete environment in a single ```python code block."
    if setting == "tool":  # the authors send no system message for tool use
        if task is None:
            raise ValueError("tool-use prompts need task=(domain, variant); see tool_task(rng)")
        domain, variant = task
        intro = (f"Design a new multi-turn tool-use environment in Python: a simulated backend for "
                 f"{domain} that an assistant operates through tools.\nTask variant: "
                 f"{TOOL_VARIANTS[variant]}")
        flavour = ("Optional flavour: you may borrow names, products or figures from the reference "
                   "document below, but the domain above is fixed; never make the task about the "
                   f"document, and never mention it in an instruction.\n{doc}" if doc else None)
        parts = [intro, TOOL_REQUIREMENTS, TOOL_INTERFACE, TOOL_ROBUSTNESS, _skill_section(skill), flavour]
        system = None
    else:
        raise ValueError(f"setting must be one of {SETTINGS}, got {setting!r}")
    parts += [ask, memory_block or None]  # the memory block comes last
    user = [{"role": "user", "content": "\n\n".join(p for p in parts if p)}]
    return ([{"role": "system", "content": system}] if system else []) + user


# ----------------------------------------------------------------------------------------------
# ALGO: from reply to environment source


def reply_text(reply: Any) -> str:
    """A reply is a str or a Completion-like object with `.text`."""
    return reply if isinstance(reply, str) else str(getattr(reply, "text", "") or "")


def strip_thinking(text: str) -> str:
    """Remove reasoning: closed <think> blocks, anything before a stray </think>, an unclosed <think> tail."""
    text = re.sub(r"<think>.*?</think>", "", text, flags=re.S)
    if "</think>" in text:  # the chat template opened the block inside the prompt
        text = text.rsplit("</think>", 1)[1]
    return text.split("<think>", 1)[0]


def code_block(text: str) -> str:
    """First ```python fence, else first untagged fence, else the whole text; unclosed runs to the end."""
    for opener in (r"```(?:python3?|py)[ \t]*\n", r"```[ \t]*\n"):
        m = re.search(opener, text, flags=re.I)
        if m:
            end = text.find("```", m.end())
            return text[m.end():] if end < 0 else text[m.end():end]
    return text


def _parses(source: str) -> bool:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # invalid escapes like "\d" in designer code are not our concern
            ast.parse(source)
        return True
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False


_WORD = re.compile(r"\w+")
_STRING_PREFIXES = {"", "r", "u", "f", "b", "rb", "br", "fr", "rf"}


def _fstring_edits(src: str) -> list[tuple[int, str]]:
    """Scan the source for f-string fields that do not parse alone; return (position, brace) insertions."""
    edits, i, n, budget = [], 0, len(src), [REPAIR_BUDGET]
    while i < n:
        c = src[i]
        if c == "#":
            end = src.find("\n", i)
            i = n if end < 0 else end
        elif c.isalpha() or c == "_" or c in "'\"":
            word = _WORD.match(src, i).group() if c not in "'\"" else ""
            j = i + len(word)
            if word.lower() in _STRING_PREFIXES and src[j:j + 1] in ("'", '"'):
                delim = src[j] * 3 if src.startswith(src[j] * 3, j) else src[j]
                i = _scan_string(src, j + len(delim), word.lower(), delim, edits, budget)
                if budget[0] < 0:
                    return []  # a hostile or degenerate reply: not worth repairing
            else:
                i = j  # an identifier or keyword
        else:
            i += 1
    return edits


def _scan_string(src: str, i: int, prefix: str, delim: str, edits: list, budget: list) -> int:
    """Scan one string literal body from i; record brace fixes for f-strings; return the index after it."""
    n, is_f, raw = len(src), "f" in prefix, "r" in prefix
    while i < n and budget[0] >= 0:
        if src.startswith(delim, i):
            return i + len(delim)
        c = src[i]
        if c == "\n" and len(delim) == 1:
            return i  # unterminated single-line string: the parser will say so
        if c == "\\":
            if not raw and src.startswith("N{", i + 1):
                close = src.find("}", i)
                i = close + 1 if close > 0 else n
            else:
                i += 1 if src[i + 1:i + 2] in ("{", "}") else 2
            continue
        if is_f and c in "{}" and src[i + 1:i + 2] == c:
            i += 2  # an escaped brace
        elif is_f and c == "}":
            edits.append((i, "}"))  # a lone closing brace: double it
            i += 1
        elif is_f and c == "{":
            end = _field_end(src, i + 1, delim)
            budget[0] -= (end if end and end > 0 else i + MAX_FIELD_CHARS) - i + 100  # + a parse
            if end == -1:
                i += 1  # too long to judge: leave it to the parser
            elif end is None:
                edits.append((i, "{"))  # an unclosed field: the brace was meant literally
                i += 1
            else:
                inner = src[i + 1:end]
                if not _parses(f"{prefix}{delim}{{{inner}}}{delim}"):
                    edits += [(i, "{"), (end, "}")]
                i = end + 1
        else:
            i += 1
    return n


def _field_end(src: str, i: int, delim: str) -> int | None:
    """Index of the '}' closing an f-string field starting at i; None if it never closes; -1 if too long."""
    depth, n = 0, min(len(src), i + MAX_FIELD_CHARS)
    while i < n:
        c = src[i]
        if c == "\n" and len(delim) == 1 or src.startswith(delim, i) and len(delim) == 3:
            return None
        if c in "'\"":
            close = src.find(c, i + 1, n)
            if close < 0 or (len(delim) == 1 and "\n" in src[i:close]):
                return None
            i = close + 1
            continue
        if c in "([{":
            depth += 1
        elif c in ")]}":
            if depth == 0:
                return i if c == "}" else None
            depth -= 1
        i += 1
    return -1 if n < len(src) else None


def repair_fstring_braces(source: str, rounds: int = REPAIR_ROUNDS) -> str | None:
    """Return `source` if it parses, else a version with broken f-string fields' braces doubled, else None."""
    for _ in range(rounds + 1):
        if _parses(source):
            return source
        edits = _fstring_edits(source)
        if not edits:
            return None
        for pos, brace in sorted(edits, reverse=True):
            source = source[:pos] + brace + source[pos:]
    return None


def extract_environment(reply: Any) -> str | None:
    """The environment source of a designer reply (thinking removed, braces repaired), or None."""
    code = code_block(strip_thinking(reply_text(reply))).strip()
    return repair_fstring_braces(code) if code else None


def find_env_class(source: str) -> str | None:
    """Name of the last module-level class whose name ends in 'Env' (deviation 1)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    names = [node.name for node in tree.body if isinstance(node, ast.ClassDef) and node.name.endswith("Env")]
    return names[-1] if names else None


# ----------------------------------------------------------------------------------------------
# ALGO: one regeneration: generate -> extract -> validate, retrying failed slots (Algorithm 1)


@dataclass
class Proposal:
    """One designer attempt for one slot; accepted ones become environments and training samples."""
    skill: str
    setting: str = "games"
    slot: int = 0                   # index into skills_for_slots
    attempt: int = 1                # 1-based attempt number of this slot
    doc_id: str | None = None       # corpus document the prompt was grounded in
    messages: list[dict] = field(default_factory=list)  # the designer chat (train renders it to tokens)
    task: tuple[str, str] | None = None  # (domain, variant) for tool use
    reply: Any = None               # the engine's Completion (token_ids, logprobs) or a str
    source: str | None = None       # extracted (and repaired) code; raw code when it did not parse
    class_name: str | None = None
    repaired: bool = False          # brace repair changed the code
    ok: bool = False
    reason: str | None = None       # rejection kind: no_code, truncated, syntax, no_class, or the sandbox's
    error: str | None = None        # rejection message
    hint: str | None = None
    doc_title: str | None = None    # the document's title (run logs only; never in a prompt)

    def to_log(self) -> dict:
        """JSON-friendly summary for the run's logs (the reply object itself is not serialised)."""
        return {"skill": self.skill, "setting": self.setting, "slot": self.slot, "attempt": self.attempt,
                "doc_id": self.doc_id, "doc_title": self.doc_title,
                "task": list(self.task) if self.task else None, "ok": self.ok,
                "reason": self.reason, "error": self.error, "class_name": self.class_name,
                "repaired": self.repaired, "hint": self.hint, "source": self.source,
                "finish_reason": getattr(self.reply, "finish_reason", None)}


def _judge(p: Proposal, validate: Callable) -> None:
    """Fill in source, class name, ok and the rejection reason of an answered proposal."""
    text = strip_thinking(reply_text(p.reply))
    code = code_block(text).strip()
    if not code:
        p.reason, p.error = "no_code", "the reply contains no code"
        return
    source = repair_fstring_braces(code)
    if source is None and "```" not in text and not re.search(r"^\s*(class|def|import)\s", text, re.M):
        p.reason, p.error = "no_code", "no ```python block, and the reply is not Python"
        return
    if source is None:
        p.source = code
        cut = getattr(p.reply, "finish_reason", None) == "length"
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ast.parse(code)
        except SyntaxError as e:
            p.error = f"{e.msg} (line {e.lineno})"
        except (ValueError, RecursionError, MemoryError) as e:
            p.error = f"{type(e).__name__}: {e}"
        p.reason = "truncated" if cut else "syntax"
        return
    p.source, p.repaired, p.class_name = source, source != code, find_env_class(source)
    if p.class_name is None:
        p.reason, p.error = "no_class", "no module-level class whose name ends in 'Env'"
        return
    for retry in range(VALIDATE_RETRIES + 1):
        try:
            report = validate(source)
            break
        except Exception as e:  # INFRA: the sandbox raises only for its own faults; retry them
            if retry == VALIDATE_RETRIES:
                raise
            log.warning("validate raised %s: %s; retrying", type(e).__name__, e)
    p.ok = bool(report.ok)
    p.class_name = getattr(report, "class_name", None) or p.class_name
    if not p.ok:
        p.reason = getattr(report, "kind", None) or "invalid"
        p.error = getattr(report, "error", None)


def regenerate(skills_for_slots: Sequence[str], *, generate: Callable, validate: Callable,
               corpus: Corpus | None, memory_block: Callable[[str], str] | None, setting: str,
               rng: random.Random, max_attempts: int = MAX_ATTEMPTS,
               concurrency: int = 1) -> tuple[list[Proposal], dict]:
    """Write one environment per slot, with up to `max_attempts` attempts per slot.

    generate(list of chats) -> list of replies (str or Completion); validate(source) -> report
    with .ok, .error, .class_name, .kind (the caller binds the setting, e.g.
    `lambda src: sb.validate(src, setting=setting)`); memory_block(skill) -> str (None: no memory).
    Each round batches every still-failing slot into one generate call and judges the replies
    `concurrency` at a time (validate must then be thread-safe, as the sandbox's is: it is how
    `Sandbox.validate_many` runs); every attempt gets a fresh document. Returns all proposals
    (accepted and rejected, in attempt order) and statistics.
    """
    proposals, pending = [], list(range(len(skills_for_slots)))
    for attempt in range(1, max_attempts + 1):
        if not pending:
            break
        batch = []
        for slot in pending:
            skill = skills_for_slots[slot]
            doc = corpus.sample() if corpus is not None else None
            task = tool_task(rng) if setting == "tool" else None
            block = memory_block(skill) if memory_block is not None else ""
            messages = designer_messages(skill, setting=setting, document=doc, memory_block=block,
                                         task=task, rng=rng)
            batch.append(Proposal(skill, setting, slot, attempt, doc.doc_id if doc else None, messages, task,
                                  doc_title=doc.title if doc else None))
        replies = generate([p.messages for p in batch])
        if len(replies) != len(batch):
            raise ValueError(f"generate returned {len(replies)} replies for {len(batch)} prompts")
        for p, reply in zip(batch, replies):
            p.reply = reply
        with ThreadPoolExecutor(max(1, concurrency)) as pool:  # sandbox probes wait, not compute
            list(pool.map(lambda p: _judge(p, validate), batch))
        proposals += batch
        pending = [p.slot for p in batch if not p.ok]
    return proposals, regeneration_stats(proposals, len(skills_for_slots))


def regeneration_stats(proposals: Sequence[Proposal], n_slots: int) -> dict:
    """Metrics of one regeneration; train.py logs them under "designer/" (keys in the README)."""
    valid = sum(p.ok for p in proposals)
    stats = {"slots": n_slots, "attempts": len(proposals), "valid": valid,
             "validity_rate": valid / len(proposals) if proposals else 0.0,  # per attempt
             "first_attempt_validity_rate":
                 sum(p.ok for p in proposals if p.attempt == 1) / n_slots if n_slots else 0.0,
             "empty_slots": n_slots - valid,
             "repaired": sum(p.ok and p.repaired for p in proposals)}
    for p in proposals:
        if not p.ok:
            stats[f"rejected/{p.reason}"] = stats.get(f"rejected/{p.reason}", 0) + 1
    return stats


# ----------------------------------------------------------------------------------------------
# ALGO: the privileged hint

HINT_SYSTEM = {
    # ALGO: the authors' games hint prompt, in our words: plain text, 1-3 sentences, under 100 words.
    "games": """You read the source code of a text game and write a hint for the LLM that will play it.

The player sees only the text observations and replies with \\boxed{answer}; it cannot see the
code, only you can. Your hint is appended to the player's first observation.

Read the code and work out:
1. what puzzle the player faces, seen from the player's side rather than the code's;
2. how the right answer or winning line is determined (follow reset() and the checks in step());
3. the answer format step() accepts (a number, a word, a list, a move, ...).

Write a hint that gives the key insight or strategy for THIS game and the expected answer format
(for example "answer with one integer" or "give a comma-separated list").

Rules:
- 1-3 sentences, under 100 words.
- Mention only what the player can see in the observations, never code internals.
- Be specific to this game: no generic advice such as "think carefully".
- Do not give away the exact answer; explain how to get there.

Good: "The hidden rule adds the two previous terms; extend the sequence one step. Answer with one
integer."
Bad: "reset() stores the answer in self.solution; try to work out what it is."

Reply with the hint text only: no JSON, no markdown, no labels.""",
    # ALGO: the authors' tool-use hint prompt, in our words: a value-free procedural strategy.
    "tool": """You read the source code of a multi-turn tool-use environment and write a strategy hint
for the LLM agent that will operate it.

The agent cannot see the code, only you can. It receives one user instruction at a time, calls
tools as <tool_call>{"name": "...", "arguments": {...}}</tool_call>, reads each result, and may
submit <answer>done</answer> only after every instruction is satisfied. Your hint is appended to
its first observation. It must get the agent unstuck without doing the task for it: finding the
concrete values by calling tools is the skill being trained, and a hint that can be copied to win
teaches nothing (and rewards environments that cannot be solved without the leak).

Read the code and describe only the strategy:
- the phases in terms of tool roles and their order (which kind of lookup feeds which change),
  and which tools are distractors or out of scope;
- work one instruction at a time, and submit <answer>done</answer> only after the last one is
  done, never as a first move or an immediate final answer;
- find the arguments with the lookup or list tools and from each instruction, never assume them;
  if an instruction leaves out a required argument, ask for it instead of guessing; if a request
  is outside what the tools can do, decline it.

Rules:
- Never write a concrete value from the code or the hidden state: no ids, names, file names,
  paths, amounts, dates or status strings. Use placeholders such as <order_id> or words such as
  "the order the user names".
- No filled-in call-by-call walkthrough; no state-variable names or predicate code.
- 2-3 sentences, under 100 words, specific to this environment's tools and goal.

Good: "Take the requests in order: look up the record the user refers to with the search tool,
then change it with the update tool; the export tool is a distractor. Read the exact ids from the
tool results. Submit <answer>done</answer> after the final request."
Bad (leaks the answer): "Call update_order(order_id='A17', status='shipped'), then submit done."

Reply with the hint text only: no JSON, no markdown, no labels.""",
}


def hint_messages(source: str, setting: str) -> list[dict]:
    """The hint call as the authors send it: the setting's system prompt, then only the code."""
    return [{"role": "system", "content": HINT_SYSTEM[setting]},
            {"role": "user", "content": f"Environment code:\n```python\n{source}\n```"}]


def parse_hint(reply: Any) -> str | None:
    """The value of a JSON object's "hint" key if the reply holds one, else the stripped text; capped."""
    text = strip_thinking(reply_text(reply)).strip()
    hint = None
    decoder = json.JSONDecoder()
    for m in re.finditer(r"\{", text):
        try:
            obj, _ = decoder.raw_decode(text, m.start())
        except ValueError:
            continue
        if isinstance(obj, dict) and isinstance(obj.get("hint"), str):
            hint = obj["hint"]
            break
    if hint is None:
        hint = re.sub(r"^```\w*\n?|\n?```$", "", text).strip()
    words = hint.split()
    if len(words) > HINT_MAX_WORDS:
        hint = " ".join(words[:HINT_MAX_WORDS]) + " ..."
    return hint.strip() or None


def write_hints(proposals: Sequence[Proposal], generate: Callable) -> list[str | None]:
    """Hints for every proposal that has a source and was not rejected, in one generate call.

    Sets each such proposal's `.hint`; returns one entry per input proposal (None where skipped).
    A bare `Proposal(skill=..., setting=..., source=...)` also works (e.g. a carried environment).
    """
    todo = [p for p in proposals if p.source and p.reason is None]
    if todo:
        replies = generate([hint_messages(p.source, p.setting) for p in todo])
        if len(replies) != len(todo):
            raise ValueError(f"generate returned {len(replies)} replies for {len(todo)} prompts")
        for p, reply in zip(todo, replies):
            p.hint = parse_hint(reply)
    return [p.hint if p.source and p.reason is None else None for p in proposals]
