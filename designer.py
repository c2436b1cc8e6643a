"""The Environment Designer: skills, corpus grounding, designer prompts, reply parsing, hints.

SPADE (arXiv 2608.19197; Algorithm 1 lines 3-6: skills in Sec. 3.1, grounding in Sec. 3.2, the
tool-use designer in Sec. 4.2) makes the policy write complete multi-turn environments as Python
classes. Each regeneration picks the active skills by round robin, grounds every attempt in a
document sampled from a corpus, shows the environment memory (memory.py), extracts the code from
the reply, validates it in the sandbox (up to 5 attempts per slot, a fresh document each time;
invalid attempts are rejection-sampled away, never trained on), and then asks the same policy for a
privileged hint used by the hint-based regret, Eq. (3). The prompt texts and skill tables live in
data/prompts/ beside this file (copy it along).

    round robin:  e = step // R,  start = (e * k) mod n,  active = S[start], ..., S[start + k - 1]
    slot i of a regeneration gets skill active[i mod k]
    hinted first observation = f"{observation}\\n\\nHINT: {hint}"

Symbols (paper -> code):
    S, n (skills)              GAME_SKILLS / TOOL_SKILLS, len(skills)
    k (active per regen)       per_regen  (3 for games, 6 for tool use)
    R (regeneration interval)  interval   (4 for games, 8 for tool use)
    N (environments per regen) len(skills_for_slots) (24 in the paper)
    d (corpus document)        Document
    h(e) (privileged hint)     write_hints(...)[i]

Deviations from the paper and from the authors' code:
    1. The environment class is the LAST module-level class whose name ends in "Env" (the
       sandbox's report, when it names a class, takes precedence).
    2. Code: the first ```python (or ```py) fence, else an untagged ``` fence, else the whole
       reply; an unclosed fence (a reply cut at the token cap) runs to the end.
    3. Brace repair doubles the braces of f-string fields that do not parse on their own (e.g.
       f"answer \\boxed{<move>}"), at most 3 rounds, kept only if `ast` parses the result.
    4. A reply that hit the token cap and does not parse is rejected as "truncated", not "syntax".
    5. Tool-use prompts carry the authors' content in our words (six tool skills, the domain
       rotation, task variants weighted 3:2:1:1, distractor tools, an enum parameter, no system
       message, a plain-text hint prompt with their rules). The environment declares (instruction,
       predicate) pairs that the ToolEnv base class advances (authors: each tool calls its own
       `_advance_if_done`), and the document comes last.
    6. Tool-use solvability is executable (the sandbox replays solution()), not the authors' LLM
       self-audit; the prompt tells the designer so.
    7. A hint is capped at 100 words; a hint still empty after HINT_ATTEMPTS requests (3, as the
       authors' tries) becomes None (regret 0, as the authors').
    8. `validate` is retried up to twice when it raises (the sandbox raises only for its own
       faults; README, "Running model-written code safely"); a third failure propagates.
    9. The games prompts (the no-corpus ablation has its own, as the authors') demand all
       randomness from `random.Random(seed)`, since validation replays a seed (sandbox.py); the
       no-corpus reference example is a short description, not the authors' full listing. Their
       outlines read the move from the LAST box, the one agent.parse_action keeps (the authors'
       read the first; agent.py sends a single box, so both read the same move).
   10. Hint calls use the designer's top-p 0.95 / top-k 20 (the authors pass none: their
       adapter's top-p 0.9, top-k off).
   11. The no-corpus prompt has no math-verify `verify_answer` helper (the authors' has): the
       package does not import in a sandbox worker, so a game using it could not load.

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
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

log = logging.getLogger(__name__)

# Both designer calls' sampling settings are config.DesignerArgs and LoopArgs fields citing the
# paper, bound into the request streams this module takes by train.regenerate (and baseline.py).
HINT_MAX_WORDS = 100                              # deviation 7
HINT_ATTEMPTS = 3                                 # hint requests per environment (authors: 3)
MAX_ATTEMPTS = 5                                  # attempts per slot (paper)
CORPUS_SEED = 42                                  # document sampler seed (paper)
CORPUS_MAX_WORDS = {"games": 6000, "tool": 4000}  # words kept per document (paper)
REPAIR_ROUNDS = 3                                 # deviation 3
MAX_FIELD_CHARS = 400    # longer "fields" are left alone
REPAIR_BUDGET = 200_000  # characters of field probing per round; beyond it a reply is not repaired
VALIDATE_RETRIES = 2                              # deviation 8

# INFRA: the texts the designer reads (the authors' content in our words) live in data/prompts/.
PROMPTS = Path(__file__).resolve().parent / "data" / "prompts"


def _prompt(name: str) -> str:
    return (PROMPTS / name).read_text(encoding="utf-8").rstrip("\n")


# ----------------------------------------------------------------------------------------------
# ALGO: skills and the round-robin curriculum


@dataclass(frozen=True)
class Skill:
    name: str
    description: str
    examples: tuple[str, ...]


def _skills(setting: str) -> tuple[Skill, ...]:
    return tuple(Skill(s["name"], s["description"], tuple(s["examples"]))
                 for s in json.loads(_prompt("skills.json"))[setting])


# The authors' six game and six tool skills with their descriptions (data/prompts/skills.json). A
# game skill's `examples` are the ideas the NO-CORPUS prompt samples three of (the corpus-grounded
# one shows only name and description); a tool skill's are its example tasks, all shown.
GAME_SKILLS, TOOL_SKILLS = _skills("games"), _skills("tool")
TWO_SKILLS = tuple(s for s in GAME_SKILLS
                   if s.name in ("Mathematical Reasoning", "Pattern Recognition"))
SKILLS = {s.name: s for s in GAME_SKILLS + TOOL_SKILLS}


def active_skills(step: int, skills: Sequence[Skill | str], per_regen: int,
                  interval: int) -> list[str]:
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
    title: str = ""   # the line's "title" or "url" field, else its first words (the report's cards)


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
                kept, truncated = truncate_words(text.strip(), self.max_words)
                self.documents.append(Document(doc_id, kept, truncated, title))
        if self.skipped:
            log.warning("corpus %s: skipped %d unreadable or empty lines", path, self.skipped)
        if not self.documents:
            raise ValueError(f"corpus {path} has no usable documents "
                             f"({self.skipped} lines skipped)")
        self.rng = random.Random(seed)

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

_TASKS = json.loads(_prompt("tool_tasks.json"))  # the ten tool-use domains and four task variants
TOOL_DOMAINS, TOOL_VARIANTS = tuple(_TASKS["domains"]), _TASKS["variants"]
# The authors' rotation: the common variants more often, the rarer benchmark cases once each.
TOOL_VARIANT_WEIGHTS = {"execute": 3, "read_then_write": 2, "missing_parameter": 1, "decline": 1}

GAMES_SYSTEM = ("You write text games in Python for training reasoning agents. Each game you make "
                "is interactive and multi-turn: the player decides something on every turn, and "
                "each decision changes what the game looks like next.")

# ALGO: the corpus-grounded games prompt: the authors' content in our own words and order
# (outline with max_turns=12 and solution(), the turn contract, design rules and rejected
# designs, grounding, reward range, robustness, self-verification).
GAMES_SPEC = _prompt("games_spec.txt")
# ALGO: the no-corpus ablation's prompt: the content of the authors' separate multi-turn prompt
# (per-skill ideas, six archetypes, six failure modes, optimal play in max_turns/2 ..
# 3*max_turns/4 turns), reworded and reordered.
NO_CORPUS_SPEC = _prompt("no_corpus_spec.txt")


def games_prompt(skill: Skill, document: Document | None, rng: random.Random | None = None,
                 max_turns: int = 25) -> str:
    """The games designer's user message: corpus-grounded (the paper's runs) or the no-corpus
    ablation's own prompt, which alone carries game ideas (3 sampled from the skill's 4)."""
    if document is not None:
        return ("Design an interactive, multi-turn text game in Python whose play rests on an idea "
                "or method taken from the reference document below.\nSkill to train: "
                f"{skill.name} ({skill.description}). Difficulty: medium, so reaching the goal "
                "takes at least 3 moves.\n\n"
                f"<REFERENCE_DOCUMENT>\n{document.text}\n</REFERENCE_DOCUMENT>\n\n{GAMES_SPEC}\n\n"
                f"Reply with the finished code of your {skill.name} game in one ```python block.")
    ideas = (rng or random.Random(0)).sample(skill.examples, min(3, len(skill.examples)))
    return (f"Design a text game in Python, played over many turns, that trains {skill.name} "
            f"({skill.description}).\n\nPossible themes (use one of them, or a close relative "
            "of your own):\n" + "\n".join(f"- {e}" for e in ideas) + "\n\n"
            + NO_CORPUS_SPEC.format(max_turns=max_turns, lo=max_turns // 2, hi=max_turns * 3 // 4)
            + f"\n\nReply with the finished code of your {skill.name} game in one ```python block.")


# ALGO: the tool-use prompt's fixed part: interaction requirements, the ToolEnv interface and
# its executable solvability check (deviation 6), robustness rules.
TOOL_SPEC = _prompt("tool_spec.txt")


def tool_task(rng: random.Random) -> tuple[str, str]:
    """One of the ten domains (uniform) and one task variant (weights 3:2:1:1, the authors') for a
    tool-use prompt."""
    rotation = [v for v, w in TOOL_VARIANT_WEIGHTS.items() for _ in range(w)]
    return rng.choice(TOOL_DOMAINS), rng.choice(rotation)


def _skill_section(skill: Skill) -> str:
    ideas = "\n".join(f"- {e}" for e in skill.examples)
    return (f"## Target skill\n{skill.name}: {skill.description}.\nIdeas for inspiration (invent "
            f"your own):\n{ideas}\nDifficulty: medium, the goal needs 3 or more interaction steps.")


def designer_messages(skill: str | Skill, *, setting: str = "games",
                      document: Document | None = None, memory_block: str = "",
                      task: tuple[str, str] | None = None,
                      rng: random.Random | None = None, max_turns: int = 25) -> list[dict]:
    """The designer chat for one attempt; `task` = (domain, variant) is required for tool use;
    `rng` samples the no-corpus prompt's game ideas, whose turn budget is `max_turns` (the
    agent's). The memory block comes last."""
    skill = SKILLS[skill] if isinstance(skill, str) else skill
    if setting == "games":
        user = "\n\n".join(p for p in (games_prompt(skill, document, rng, max_turns), memory_block)
                           if p)
        return [{"role": "system", "content": GAMES_SYSTEM}, {"role": "user", "content": user}]
    if setting != "tool":
        raise ValueError(f"setting must be 'games' or 'tool', got {setting!r}")
    if task is None:
        raise ValueError("tool-use prompts need task=(domain, variant); see tool_task(rng)")
    domain, variant = task
    intro = (f"Design a new multi-turn tool-use environment in Python: a simulated backend for "
             f"{domain} that an assistant operates through tools.\n"
             f"Task variant: {TOOL_VARIANTS[variant]}")
    flavour = ("Optional flavour: you may borrow names, products or figures from the reference "
               "document below, but the domain above is fixed; never make the task about the "
               "document, and never mention it in an instruction.\n<REFERENCE_DOCUMENT>\n"
               f"{document.text}\n</REFERENCE_DOCUMENT>" if document else None)
    parts = [intro, TOOL_SPEC, _skill_section(skill), flavour,
             "Write the complete environment in a single ```python code block.", memory_block]
    # the authors send no system message for tool use
    return [{"role": "user", "content": "\n\n".join(p for p in parts if p)}]


# ----------------------------------------------------------------------------------------------
# ALGO: from reply to environment source


def reply_text(reply: Any) -> str:
    """A reply is a str or a Completion-like object with `.text`."""
    return reply if isinstance(reply, str) else str(getattr(reply, "text", "") or "")


def strip_thinking(text: str) -> str:
    """Remove reasoning: closed <think> blocks, anything before a stray </think>,
    an unclosed <think> tail."""
    text = re.sub(r"<think>.*?</think>", "", text, flags=re.S)
    if "</think>" in text:  # the chat template opened the block inside the prompt
        text = text.rsplit("</think>", 1)[1]
    return text.split("<think>", 1)[0]


def code_block(text: str) -> str:
    """First ```python fence, else first untagged fence, else the whole text;
    unclosed runs to the end."""
    for opener in (r"```(?:python3?|py)[ \t]*\n", r"```[ \t]*\n"):
        m = re.search(opener, text, flags=re.I)
        if m:
            end = text.find("```", m.end())
            return text[m.end():] if end < 0 else text[m.end():end]
    return text


def _parse(source: str) -> ast.Module | str:
    """The module's syntax tree, or the parser's error message."""
    try:
        with warnings.catch_warnings():
            # invalid escapes like "\d" in designer code are not our concern
            warnings.simplefilter("ignore")
            return ast.parse(source)
    except SyntaxError as e:
        return f"{e.msg} (line {e.lineno})"
    except (ValueError, RecursionError, MemoryError) as e:
        return f"{type(e).__name__}: {e}"


def _parses(source: str) -> bool:
    return not isinstance(_parse(source), str)


# A comment, or the opening quote of a string literal with its prefix (if any).
_LITERAL = re.compile(r"""#[^\n]*|(?:(?<!\w)((?i:rb|br|fr|rf|[rubf])))?('''|\"\"\"|'|")""")


def _fstring_edits(src: str) -> list[tuple[int, str]]:
    """(position, brace) insertions that double the braces of f-string fields which do not parse on
    their own (a lone '}', an unclosed '{', a field like {<move>}); [] once probing the fields
    would cost more than REPAIR_BUDGET characters (a hostile or degenerate reply)."""
    edits, budget, i = [], REPAIR_BUDGET, 0
    while m := _LITERAL.search(src, i):
        i = m.end()
        if m[0].startswith("#"):
            continue
        prefix, delim = (m[1] or "").lower(), m[2]
        is_f = "f" in prefix
        while i < len(src) and not src.startswith(delim, i):
            c, nxt = src[i], src[i + 1:i + 2]
            if c == "\n" and len(delim) == 1:
                break  # an unterminated string: the parser will say so
            if c == "\\" and "r" not in prefix and src.startswith("N{", i + 1):
                i = src.find("}", i) + 1 or len(src)  # \N{NAME}
            elif c == "\\":
                i += 1 if nxt in ("{", "}") else 2  # in an f-string, \{ still opens a field
            elif is_f and c in "{}" and nxt == c:
                i += 2  # an escaped brace
            elif is_f and c == "}":
                edits.append((i, "}"))  # a lone closing brace: double it
                i += 1
            elif is_f and c == "{":
                end = _field_end(src, i + 1, delim)
                closed = end is not None and end > 0
                budget -= (end if closed else i + MAX_FIELD_CHARS) - i + 100  # + one parse
                if budget < 0:
                    return []
                if end is None:
                    edits.append((i, "{"))  # an unclosed field: the brace was meant literally
                elif closed and not _parses(f"{prefix}{delim}{{{src[i + 1:end]}}}{delim}"):
                    edits += [(i, "{"), (end, "}")]
                i = end + 1 if closed else i + 1  # a field too long to judge (-1) is left alone
            else:
                i += 1
        if src.startswith(delim, i):
            i += len(delim)
    return edits


def _field_end(src: str, i: int, delim: str) -> int | None:
    """Index of the '}' closing an f-string field starting at i; None if it never
    closes; -1 if too long."""
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
    """Return `source` if it parses, else a version with broken f-string fields' braces
    doubled, else None."""
    for _ in range(rounds + 1):
        if _parses(source):
            return source
        edits = _fstring_edits(source)
        if not edits:
            return None
        for pos, brace in sorted(edits, reverse=True):
            source = source[:pos] + brace + source[pos:]
    return None


def find_env_class(source: str) -> str | None:
    """Name of the last module-level class whose name ends in 'Env' (deviation 1)."""
    tree = _parse(source)
    names = [] if isinstance(tree, str) else [
        node.name for node in tree.body
        if isinstance(node, ast.ClassDef) and node.name.endswith("Env")]
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
    # the designer chat (train renders it to tokens)
    messages: list[dict] = field(default_factory=list)
    task: tuple[str, str] | None = None  # (domain, variant) for tool use
    reply: Any = None               # the engine's Completion (token_ids, logprobs) or a str
    source: str | None = None       # extracted (and repaired) code; raw code when it did not parse
    class_name: str | None = None
    repaired: bool = False          # brace repair changed the code
    ok: bool = False
    reason: str | None = None       # rejection kind: no_code, truncated, syntax, no_class,
                                    # or the sandbox's
    error: str | None = None        # rejection message
    doc_title: str | None = None    # the document's title (run logs only; never in a prompt)

    def to_log(self) -> dict:
        """JSON-friendly summary for the run's logs (the reply object itself is not serialised)."""
        return {"skill": self.skill, "setting": self.setting, "slot": self.slot,
                "attempt": self.attempt, "doc_id": self.doc_id, "doc_title": self.doc_title,
                "task": list(self.task) if self.task else None, "ok": self.ok,
                "reason": self.reason, "error": self.error, "class_name": self.class_name,
                "repaired": self.repaired, "source": self.source,
                "finish_reason": getattr(self.reply, "finish_reason", None)}


def _judge(p: Proposal, validate: Callable) -> None:
    """Fill in source, class name, ok and the rejection reason of an answered proposal."""
    text = strip_thinking(reply_text(p.reply))
    code = code_block(text).strip()
    if not code:
        p.reason, p.error = "no_code", "the reply contains no code"
        return
    source = repair_fstring_braces(code)
    python_lines = re.search(r"^\s*(class|def|import)\s", text, re.M)
    if source is None and "```" not in text and not python_lines:
        p.reason, p.error = "no_code", "no ```python block, and the reply is not Python"
        return
    if source is None:  # deviation 4: a reply cut at the token cap is "truncated"
        cut = getattr(p.reply, "finish_reason", None) == "length"
        p.source, p.reason, p.error = code, "truncated" if cut else "syntax", _parse(code)
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


def regenerate(skills_for_slots: Sequence[str], *, stream, validate: Callable,
               corpus: Corpus | None, memory_block: Callable[[str], str] | None, setting: str,
               rng: random.Random, max_attempts: int = MAX_ATTEMPTS,
               concurrency: int = 1, max_turns: int = 25) -> tuple[list[Proposal], dict]:
    """Write one environment per slot, with up to `max_attempts` attempts per slot.

    stream: the policy's requests (infra/stream.py's Stream), submit(key, chat), collect(wait)
    -> [(key, reply)], pending, serve(fn): replies are judged while other attempts decode, and a
    rejected attempt's retry goes in as soon as its judgment is back (on a turn barrier, which
    decodes only when waited on, the retries of a round go in as one batch).
    validate(source) -> report with .ok, .error, .class_name, .kind (the caller binds the
    setting); memory_block(skill) -> str (None: no memory); max_turns: the agent's turn budget,
    which the no-corpus prompt states. Replies are judged `concurrency` at a
    time (validate must be thread-safe, as `Sandbox.validate` is). Every attempt gets a fresh
    document; attempt n's prompts are drawn for every slot when the first slot needs one, so a
    retry's document never depends on when validations finish. Returns all proposals (in
    attempt order) and statistics."""
    prompts = _Prompts(skills_for_slots, corpus=corpus, memory_block=memory_block,
                       setting=setting, rng=rng, max_turns=max_turns)
    proposals = []
    for slot in range(len(skills_for_slots)):
        stream.submit((slot, 1), prompts[slot, 1].messages)
    with _Judges(validate, concurrency, stream.serve) as judges:
        while stream.pending or judges.pending:  # ALGO: generate -> judge -> retry (Algorithm 1)
            for key, reply in stream.collect(wait=not judges.pending) if stream.pending else ():
                prompts[key].reply = reply
                judges.submit(prompts[key])
            # INFRA: with attempts of ours in flight, poll (the next collect decodes on); else wait
            for p in judges.done(block=not stream.pending):
                proposals.append(p)
                if not p.ok and p.attempt < max_attempts:
                    retry = prompts[p.slot, p.attempt + 1]
                    stream.submit((p.slot, p.attempt + 1), retry.messages)
    proposals.sort(key=lambda p: (p.attempt, p.slot))
    return proposals, regeneration_stats(proposals, len(skills_for_slots))


class _Prompts:
    """prompts[slot, n]: slot's attempt n, a Proposal with its prompt. Attempt n's prompts are
    drawn for every slot, in slot order, when the first slot needs one, so a retry's document
    never depends on when validations finish. draw: _attempt's keyword arguments."""

    def __init__(self, skills: Sequence[str], **draw):
        self.skills, self.draw, self.drawn = skills, draw, []  # drawn[n - 1][slot]

    def __getitem__(self, key: tuple[int, int]) -> Proposal:
        slot, attempt = key
        while len(self.drawn) < attempt:
            n = len(self.drawn) + 1
            self.drawn.append([_attempt(skill, i, n, **self.draw)
                               for i, skill in enumerate(self.skills)])
        return self.drawn[attempt - 1][slot]


class _Judges:
    """INFRA: the answered proposals being judged, `concurrency` at a time on threads (sandbox
    probes wait, not compute). submit(p) starts judging p; done(block) yields the judged ones in
    slot order, those judged by now, or (block) once one is, waiting through serve (a TP member
    keeps serving its group meanwhile); a validate that kept raising propagates from it."""

    def __init__(self, validate: Callable, concurrency: int, serve: Callable):
        self.validate, self.serve = validate, serve
        self.pool = ThreadPoolExecutor(max(1, concurrency))
        self.judging: dict = {}  # future -> its proposal

    @property
    def pending(self) -> int:
        return len(self.judging)

    def submit(self, p: Proposal) -> None:
        self.judging[self.pool.submit(_judge, p, self.validate)] = p

    def done(self, block: bool):
        def finished():
            timeout = None if block else 0
            return wait(self.judging, timeout=timeout, return_when=FIRST_COMPLETED).done
        for f in sorted(self.serve(finished) if block else finished(),
                        key=lambda f: self.judging[f].slot):
            f.result()
            yield self.judging.pop(f)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.pool.shutdown()


def _attempt(skill: str, slot: int, attempt: int, corpus: Corpus | None,
             memory_block: Callable[[str], str] | None, setting: str, rng: random.Random,
             max_turns: int = 25) -> Proposal:
    """A slot's attempt with its prompt: a fresh document, the skill's memory block, a task."""
    doc = corpus.sample() if corpus is not None else None
    task = tool_task(rng) if setting == "tool" else None
    block = memory_block(skill) if memory_block is not None else ""
    messages = designer_messages(skill, setting=setting, document=doc, memory_block=block,
                                 task=task, rng=rng, max_turns=max_turns)
    return Proposal(skill, setting, slot, attempt, doc.doc_id if doc else None, messages, task,
                    doc_title=doc.title if doc else None)


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

# The authors' hint prompts in our words: games (plain text, 1-3 sentences, under 100 words) and
# tool use (a value-free procedural strategy).
HINT_SYSTEM = {"games": _prompt("hint_games.txt"), "tool": _prompt("hint_tool.txt")}


def hint_messages(source: str, setting: str) -> list[dict]:
    """The hint call as the authors send it: the setting's system prompt, then only the code."""
    return [{"role": "system", "content": HINT_SYSTEM[setting]},
            {"role": "user", "content": f"Environment code:\n```python\n{source}\n```"}]


def parse_hint(reply: Any) -> str | None:
    """The value of a JSON object's "hint" key if the reply holds one, else the
    stripped text; capped."""
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


def write_hints(sources: Sequence[str], setting: str, stream,
                attempts: int = HINT_ATTEMPTS) -> list[str | None]:
    """The privileged hint h(e) of each environment source (None where every reply was empty).
    Every hint request goes in at once; a reply with no hint is asked again as soon as it comes
    back, up to `attempts` requests per environment (3: the first and two retries, as the
    authors' three tries; on a turn barrier, one batch per attempt). stream: as regenerate's."""
    for i, src in enumerate(sources):
        stream.submit((i, 1), hint_messages(src, setting))
    hints: list[str | None] = [None] * len(sources)
    while stream.pending:
        for (i, n), reply in stream.collect():
            hints[i] = parse_hint(reply)
            if hints[i] is None and n < attempts:
                stream.submit((i, n + 1), hint_messages(sources[i], setting))
    return hints
