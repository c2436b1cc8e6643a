"""The designer with scripted replies: skills, corpus, prompts, extraction, hints, regeneration."""
import ast
import json
import random
import re
import subprocess
import sys
from dataclasses import dataclass, field

import pytest

import designer as d
from memory import EnvironmentMemory, MemoryRecord
from infra.stream import Batched
from scripted import seeded

MATH, LOGIC, SPATIAL, PATTERN, OPTIM, CAUSAL = (s.name for s in d.GAME_SKILLS)


# ----------------------------------------------------------------------------------------------
# skills and the round robin


def test_skill_tables():
    assert [s.name for s in d.GAME_SKILLS] == [
        "Mathematical Reasoning", "Logical Deduction", "Spatial Reasoning",
        "Pattern Recognition", "Optimization", "Causal Inference"]
    assert [s.name for s in d.TOOL_SKILLS] == [
        "API Orchestration", "Data Retrieval", "State Modification",
        "Error Recovery", "Tool Selection", "Multi-Step Workflows"]
    assert [s.name for s in d.TWO_SKILLS] == [MATH, PATTERN]
    for s in d.GAME_SKILLS + d.TOOL_SKILLS:
        assert s.description and 3 <= len(s.examples) <= 4


def test_round_robin_games_alternates_halves():
    # n=6, k=3, R=4: epoch e = step // 4, start = 3e mod 6 (0 for even e, 3 for odd e; 396 // 4 = 99).
    first, second = [MATH, LOGIC, SPATIAL], [PATTERN, OPTIM, CAUSAL]
    expected = {0: first, 3: first, 4: second, 7: second, 8: first, 12: second, 392: first, 396: second, 399: second}
    for step, active in expected.items():
        assert d.active_skills(step, d.GAME_SKILLS, 3, 4) == active, step


def test_round_robin_wraps_when_k_does_not_divide_n():
    names = [s.name for s in d.GAME_SKILLS]
    # n=6, k=4, R=2: epoch 0 start 0, epoch 1 start 4, epoch 2 start 8 mod 6 = 2, epoch 3 start 0.
    idx = {0: [0, 1, 2, 3], 1: [0, 1, 2, 3], 2: [4, 5, 0, 1], 5: [2, 3, 4, 5], 6: [0, 1, 2, 3]}
    for step, want in idx.items():
        assert d.active_skills(step, names, 4, 2) == [names[i] for i in want], step


def test_round_robin_tool_use_and_two_skills():
    tool = [s.name for s in d.TOOL_SKILLS]
    for step in (0, 7, 8, 16, 399):
        assert d.active_skills(step, d.TOOL_SKILLS, 6, 8) == tool
    # two-skill ablation with one active per regeneration alternates Math / Pattern by epoch
    assert [d.active_skills(s, d.TWO_SKILLS, 1, 4) for s in (0, 4, 8, 12)] == [[MATH], [PATTERN], [MATH], [PATTERN]]
    with pytest.raises(ValueError):
        d.active_skills(0, d.TWO_SKILLS, 3, 4)


def test_slot_assignment():
    active = [PATTERN, OPTIM, CAUSAL]
    slots = d.slot_skills(active, 24)
    assert slots[:4] == [PATTERN, OPTIM, CAUSAL, PATTERN]
    assert all(slots.count(s) == 8 for s in active)


# ----------------------------------------------------------------------------------------------
# corpus


def write_corpus(path, lines):
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_corpus_reads_text_and_orig_doc_and_counts_skipped(tmp_path, caplog):
    path = write_corpus(tmp_path / "c.jsonl", [
        json.dumps({"text": "Bees dance to share the direction of flowers."}),
        "",
        "{not json",
        json.dumps({"orig_doc": "Tides follow the moon.", "id": "doc-7"}),
        json.dumps({"text": "   "}),
        json.dumps(["a", "list"]),
        json.dumps({"title": "no text field"}),
    ])
    with caplog.at_level("WARNING"):
        corpus = d.Corpus(path)
    assert len(corpus.documents) == 2 and corpus.skipped == 4
    assert [doc.doc_id for doc in corpus.documents] == ["line 1", "doc-7"]
    assert corpus.documents[1].text == "Tides follow the moon."
    assert "skipped 4" in caplog.text


def test_corpus_truncation_by_setting(tmp_path):
    words = [f"w{i}" for i in range(7000)]
    path = write_corpus(tmp_path / "c.jsonl", [json.dumps({"text": " ".join(words)}),
                                                json.dumps({"text": "short text"})])
    games, tool = d.Corpus(path), d.Corpus(path, max_words=d.CORPUS_MAX_WORDS["tool"])
    g, t = games.documents[0], tool.documents[0]
    assert g.truncated and t.truncated and not games.documents[1].truncated
    assert g.text.startswith("w0 w1 ") and "w5999 " not in g.text and "w5999\n" in g.text and "w6000" not in g.text
    assert "first 6,000 words" in g.text
    assert "w3999\n" in t.text and "w4000" not in t.text and "first 4,000 words" in t.text
    text, cut = d.truncate_words("a  b\n\nc d", 3)
    assert cut and text.startswith("a  b\n\nc\n\n[Document truncated")


def test_corpus_sampler_is_seeded_and_resumable(tmp_path):
    path = write_corpus(tmp_path / "c.jsonl", [json.dumps({"text": f"document {i}"}) for i in range(20)])
    a, b = d.Corpus(path), d.Corpus(path)
    assert [a.sample().doc_id for _ in range(10)] == [b.sample().doc_id for _ in range(10)]
    seed42, fresh = random.Random(42), d.Corpus(path)  # the sampler is random.Random(42).choice
    assert [fresh.sample().doc_id for _ in range(5)] == [seed42.choice(a.documents).doc_id for _ in range(5)]
    state = json.loads(json.dumps(a.state_dict()))
    nxt = [a.sample().doc_id for _ in range(5)]
    c = d.Corpus(path)
    c.load_state_dict(state)
    assert [c.sample().doc_id for _ in range(5)] == nxt


def test_corpus_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="not found"):
        d.Corpus(tmp_path / "missing.jsonl")
    path = write_corpus(tmp_path / "bad.jsonl", ["garbage", "", json.dumps({"x": 1})])
    with pytest.raises(ValueError, match="no usable documents"):
        d.Corpus(path)


# ----------------------------------------------------------------------------------------------
# prompts

DOC = d.Document("doc-1", "The lighthouse keeper logged ship sightings every hour.", False)


def user_text(messages):
    assert [m["role"] for m in messages][-1:] == ["user"] and len(messages) <= 2
    return messages[-1]["content"]


# The authors' skill descriptions (their game generator's table), word for word.
AUTHORS_DESCRIPTIONS = {
    "Mathematical Reasoning": "Solving mathematical problems and equations",
    "Logical Deduction": "Drawing conclusions from given premises and rules",
    "Spatial Reasoning": "Understanding spatial relationships and mental rotation",
    "Pattern Recognition": "Identifying patterns in sequences, numbers, or text",
    "Optimization": "Finding optimal solutions under constraints",
    "Causal Inference": "Understanding cause-effect relationships",
}


@pytest.mark.parametrize("skill", d.GAME_SKILLS, ids=lambda s: s.name)
def test_games_prompt_per_skill(skill):
    """The corpus-grounded prompt carries each element of the authors' and no idea list."""
    messages = d.designer_messages(skill.name, setting="games", document=DOC, memory_block="MEMORY BLOCK")
    system = messages[0]["content"]
    assert "text games in Python" in system and "interactive and multi-turn" in system
    text = user_text(messages)
    assert skill.description == AUTHORS_DESCRIPTIONS[skill.name]
    assert f"<REFERENCE_DOCUMENT>\n{DOC.text}\n</REFERENCE_DOCUMENT>" in text
    assert f"Skill to train: {skill.name} ({skill.description}). Difficulty: medium" in text
    assert not any(e in text for s in d.GAME_SKILLS for e in s.examples)  # no idea lists here
    for needle in ("A quiz that poses one question and grades one reply", r"\boxed{<action>}",
                   r"BOX = re.compile(r'\\boxed\{(.+?)\}')", "boxes[-1]",  # the last box is the move
                   "COMMAND", "never a\n  final answer",
                   "Hidden state", "Partial reward", "terminated=True only once the goal",
                   "No single move wins", "chain of moves",
                   "Rejected designs", "marks a single boxed answer and ends the episode",  # one-shot
                   "reset() lays out the entire problem", "identical, unchanging task",
                   "applying an idea or method from the document", "EXECUTES, one step per turn",
                   "OPERATES over several turns", "never refers to the document",        # grounding
                   "def __init__(self, max_turns=12, **kwargs)", "def solution(self)",  # skeleton
                   "def reset(self, seed=None)", "def step(self, action)", "random.Random(seed)",
                   "Every reward lies in [0, 1]", "only full success pays 1.0",
                   "Do not assign to self.solution", "self._solution", "Standard library only",
                   "math.cos(x)", "literal brace is doubled", r"\boxed{{<action>}}",
                   "five values of types str, float, bool, bool and dict", "reward 0.0,\n  never an",
                   "Before you reply", "reset(seed=0) and follow two different move sequences",
                   "at least 3 moves", "```python block"):
        assert needle in text, needle
    order = [text.index(s) for s in ("Skill to train", "<REFERENCE_DOCUMENT>", "## The class",
                                     "## One turn", "## Design rules", "Rejected designs",
                                     "## Tie to the document", "## Reward",
                                     "## Code that loads and runs", "## Before you reply",
                                     "```python block", "MEMORY BLOCK")]
    assert order == sorted(order) and text.endswith("MEMORY BLOCK")  # the memory block comes last
    assert "ToolEnv" not in text and "max_turns=20" not in text
    skeleton = text.split("```python\n", 1)[1].split("```", 1)[0].replace("...", "pass")
    ast.parse(skeleton)  # the interface skeleton is itself valid Python


@pytest.mark.parametrize("spec", ["GAMES_SPEC", "NO_CORPUS_SPEC"])
def test_outline_placeholder_class_name_is_neutral(spec):
    """Early designers keep the scaffold's class name (the paper's Fig. 9 caption), so the
    placeholder names no game (a maze or a trader would pull early games toward it); as the
    authors' generic placeholders, it says only that a game name goes there."""
    outline = getattr(d, spec).split("```python\n", 1)[1].split("```", 1)[0]
    assert re.findall(r"^class (\w+)", outline, flags=re.M) == ["YourGameNameEnv"]


def test_games_outline_reads_the_move_the_agent_sends():
    """The outline's step() takes its move from the LAST box, the one agent.parse_action keeps, so a
    designer that copies it reads the move the agent meant (the first box may be a draft)."""
    from agent import last_balanced_box, parse_action
    outline = d.GAMES_SPEC.split("```python\n", 1)[1].split("```", 1)[0].splitlines()
    code = [line.split("#")[0].strip() for line in outline
            if line.startswith("BOX = ") or line.strip().startswith(("boxes = ", "move = "))]
    assert len(code) == 3, code
    for reply in ("<think>maybe \\boxed{west}</think>I go \\boxed{ north } now",
                  "\\boxed{a} first, then \\boxed{b}", "no box at all"):
        for action in (reply, parse_action(reply)):
            scope = {"action": action}
            exec("import re\n" + "\n".join(code), scope)
            box = last_balanced_box(action)
            assert scope["move"] == (action if box is None else box).strip(), action


@pytest.mark.parametrize("skill", d.GAME_SKILLS, ids=lambda s: s.name)
def test_no_corpus_prompt_is_the_authors_separate_one(skill):
    text = user_text(d.designer_messages(skill, setting="games", document=None, rng=random.Random(3)))
    assert "REFERENCE_DOCUMENT" not in text and "document" not in text
    assert len(skill.examples) == 4
    shown = [e for e in skill.examples if e in text]
    assert shown == random.Random(3).sample(skill.examples, 3) or sorted(shown) == sorted(
        random.Random(3).sample(skill.examples, 3))  # 3 of the skill's 4 ideas
    for needle in ("exploration", "trading", "survival", "investigation", "tower defense", "crafting",
                   "retries on failure", "linear search", "Only one sensible move", "won in 1-3 turns",
                   "One-turn puzzles dressed up", "input(): never", "A player moving at random should usually lose",
                   "at most 25 turns", "best line of\n  play wins in about 12-18 turns",
                   "def __init__(self, max_turns=25, **kwargs)", "A sketch of the pattern",
                   "DIFFERENT game", "1.0 with terminated=True", "0.0 with truncated=True",
                   "random.Random(seed)", "boxes[-1]", "the game goes on",
                   # the authors' rules on f-string backslashes and unreadable moves
                   "No backslash inside the {...} of an f-string", "f\"{'\\n'.join(rows)}\"",
                   "must not crash it", "lists the moves it accepts"):
        assert needle in text, needle
    skeleton = text.split("```python\n", 1)[1].split("```", 1)[0].replace("...", "pass")
    ast.parse(skeleton)
    again = user_text(d.designer_messages(skill, setting="games", document=None, rng=random.Random(3)))
    assert again == text  # seeded


@pytest.mark.parametrize("skill", d.TOOL_SKILLS, ids=lambda s: s.name)
def test_tool_prompt_per_skill(skill):
    task = ("banking", "missing_parameter")
    messages = d.designer_messages(skill, setting="tool", document=DOC, task=task)
    assert [m["role"] for m in messages] == ["user"]  # the authors send no system message here
    text = user_text(messages)
    assert skill.name in text and skill.description in text and all(e in text for e in skill.examples)
    assert "simulated backend for banking" in text and d.TOOL_VARIANTS["missing_parameter"] in text
    assert "Optional flavour" in text and DOC.text in text
    assert text.index("## Target skill") < text.index(DOC.text)  # the document comes late
    for needle in ("class OrderDeskEnv(ToolEnv)", "do not import it", "TOOLS = [", "def setup(self, rng)",
                   "self.state", "self.instructions", "3-5", "def tool_lookup_order", "def solution(self)",
                   "__init__(self, max_turns=10)", '<tool_call>{"name": ..., "arguments": {...}}</tool_call>',
                   "<answer>done</answer>", "call(name, arguments) -> str", "next instruction appended",
                   "Tool calls are free", "feedback naming the pending", "reward -0.1", "truncated",
                   "3-8 tools", "DISTRACTOR", '"enum"', '"required"', "tau2-bench",
                   "never name tools", "seeds 0, 1 and 2", "never raise", "False right after reset",
                   "```python code block"):
        assert needle in text, needle
    assert r"\boxed" not in text
    assert not text.endswith("\n")  # no memory block: the code request is last


def test_tool_prompt_needs_a_task_and_tasks_cover_the_tables():
    with pytest.raises(ValueError, match="task"):
        d.designer_messages(d.TOOL_SKILLS[0], setting="tool")
    with pytest.raises(ValueError, match="setting"):
        d.designer_messages(MATH, setting="chess")
    rng = random.Random(0)
    tasks = [d.tool_task(rng) for _ in range(400)]
    assert {t[0] for t in tasks} == set(d.TOOL_DOMAINS) and len(d.TOOL_DOMAINS) == 10
    assert {t[1] for t in tasks} == set(d.TOOL_VARIANTS) == set(d.TOOL_VARIANT_WEIGHTS)
    assert tasks[:20] == [d.tool_task(r) for r in [random.Random(0)] for _ in range(20)]


# ----------------------------------------------------------------------------------------------
# extraction and brace repair

GOOD = r'''import random
import re


class NAMEEnv:
    def __init__(self, max_turns: int = 8):
        self.max_turns = max_turns
        self.secret = 0
        self.turn = 0

    def reset(self, seed=None):
        self.rng = random.Random(seed)
        self.secret = self.rng.randint(1, 50)
        self.turn = 0
        return f"Guess a number from 1 to 50. Answer as \\boxed{{n}}. Turns left: {self.max_turns}.", {}

    def step(self, action):
        self.turn += 1
        m = re.search(r"\\boxed\{(-?\d+)\}", action)
        truncated = self.turn >= self.max_turns
        if not m:
            return f"Invalid move. Answer as \\boxed{{n}}, turns left: {self.max_turns - self.turn}.", 0.0, False, truncated, {}
        guess = int(m.group(1))
        if guess == self.secret:
            return "Correct!", REWARD, True, False, {}
        hint = "higher" if guess < self.secret else "lower"
        return f"Go {hint}. Answer as \\boxed{{n}}.", 0.0, False, truncated, {}
'''


def env(name, reward="1.0", src=GOOD):
    return src.replace("NAME", name).replace("REWARD", reward)


def fenced(code, before="Here is my environment.", after="It is medium difficulty."):
    return f"{before}\n```python\n{code}```\n{after}"


def extract_environment(reply):
    """The environment source of a reply as `regenerate` reads it (thinking removed, braces repaired)."""
    code = d.code_block(d.strip_thinking(d.reply_text(reply))).strip()
    return d.repair_fstring_braces(code) if code else None


def test_extract_fenced_unfenced_think_and_truncated():
    code = env("Dial")
    assert extract_environment(fenced(code)) == code.strip()
    assert extract_environment(code) == code.strip()  # no fence: the whole reply
    think = f"<think>Maybe ```python\nclass DraftEnv: pass\n``` no.</think>\n{fenced(code)}"
    assert extract_environment(think) == code.strip()
    stray = f"Plan: ```python\nclass DraftEnv: pass\n```</think>{fenced(code)}"  # opening tag was in the prompt
    assert extract_environment(stray) == code.strip()
    assert extract_environment("<think>I will write ```python\nclass AEnv: pass\n```") is None  # cut while thinking
    assert extract_environment(f"```py\n{code}```") == code.strip()
    assert extract_environment(f'```json\n{{"a": 1}}\n```\n```python\n{code}```') == code.strip()
    assert extract_environment(f"```\n{code}```") == code.strip()  # untagged fence
    cut = fenced(code)[: fenced(code).index("if guess == ") + 12]  # token cap hit mid-function
    assert extract_environment(cut) is None
    assert extract_environment("```python\nclass BrokenEnv:\n    def reset(self\n") is None
    assert extract_environment("") is None and extract_environment("no code at all") is None


@dataclass
class FakeCompletion:
    text: str
    finish_reason: str = "stop"
    token_ids: list = field(default_factory=lambda: [1, 2, 3])
    logprobs: list = field(default_factory=lambda: [-0.1, -0.2, -0.3])


def test_extract_accepts_completion_objects():
    assert extract_environment(FakeCompletion(fenced(env("Dial")))) == env("Dial").strip()


@pytest.mark.parametrize("broken, fixed_fragment", [
    ('f"Answer as \\\\boxed{<move>}. Turn {self.turn}."', 'f"Answer as \\\\boxed{{<move>}}. Turn {self.turn}."'),
    ('f"Valid moves: {up, down, or left}; at {self.pos}"', 'f"Valid moves: {{up, down, or left}}; at {self.pos}"'),
    ('f"Use {} to pass. Score {self.score}"', 'f"Use {{}} to pass. Score {self.score}"'),
    ('f"Grid: {self.grid}}"', 'f"Grid: {self.grid}}}"'),
    ("f'Format: \\\\boxed{row col} ({self.n} left)'", "f'Format: \\\\boxed{{row col}} ({self.n} left)'"),
])
def test_brace_repair_single_line(broken, fixed_fragment):
    src = f"class GridEnv:\n    def obs(self):\n        return {broken}\n"
    with pytest.raises(SyntaxError):
        ast.parse(src)
    repaired = d.repair_fstring_braces(src)
    assert repaired == src.replace(broken, fixed_fragment)
    ast.parse(repaired)


def test_brace_repair_realistic_environment_runs():
    broken = env("Dial").replace("Answer as \\\\boxed{{n}}. Turns left", "Answer as \\\\boxed{<n>}. Turns left")
    broken = broken.replace("Go {hint}.", "Go {hint} (a {1..50} guess).")
    assert extract_environment(fenced(broken)) is not None
    ns = {}
    exec(extract_environment(fenced(broken)), ns)
    game = ns["DialEnv"]()
    obs, _ = game.reset(seed=3)
    assert r"Answer as \boxed{<n>}. Turns left: 8." in obs
    assert "{1..50} guess" in game.step(r"\boxed{0}")[0]


def test_brace_repair_multiline_and_limits():
    src = 'def f(n):\n    return f"""Pick one of {1, 2, or 3}.\nTurn {n}.\n"""\n'
    assert d.repair_fstring_braces(src) == src.replace("{1, 2, or 3}", "{{1, 2, or 3}}")
    valid = 'x, w = 2, 5\ns = f"{x:{w}} and {{literal}}"  # f"{not touched}"\n'
    assert d.repair_fstring_braces(valid) == valid  # valid code is never changed
    assert d.repair_fstring_braces("def f(:\n    return f'{a b}'\n") is None  # another error remains
    assert d.repair_fstring_braces('s = "a {plain} string"\nif x\n') is None  # nothing to repair
    assert d.repair_fstring_braces("") == ""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("hostile", [
    'f"""' + "{a " * 20000 + '"""\nx(',         # thousands of fields that never close
    "x = f'" + "}" * 30000 + "'\n(",             # a flood of lone braces plus another error
    'f"""' + "{a b}" * 12000 + '"""',             # more broken fields than the repair budget
    "s = f'{" + "(" * 5000 + "'",                 # deep nesting inside one field
])
def test_brace_repair_gives_up_on_hostile_replies(hostile):
    assert d.repair_fstring_braces(hostile) is None


def test_find_env_class_takes_the_last_module_level_env():
    src = "class AEnv: pass\nclass Helper: pass\ndef f():\n    class InnerEnv: pass\nclass BEnv(AEnv): pass\n"
    assert d.find_env_class(src) == "BEnv"
    assert d.find_env_class("class Game: pass\n") is None
    assert d.find_env_class("class (:") is None


# ----------------------------------------------------------------------------------------------
# hints


def test_parse_hint_json_plain_and_caps():
    assert d.parse_hint('{"hint": "Binary search the range."}') == "Binary search the range."
    assert d.parse_hint('Sure! ```json\n{"hint": "Track parity.", "x": 1}\n```') == "Track parity."
    assert d.parse_hint('<think>{"hint": "wrong"}</think>{"hint": "Right one."}') == "Right one."
    assert d.parse_hint("  Halve the interval each turn; answer as \\boxed{n}.  ") == \
        "Halve the interval each turn; answer as \\boxed{n}."
    assert d.parse_hint('Use {"hint" style braces} loosely') == 'Use {"hint" style braces} loosely'
    assert d.parse_hint('{"other": 1}') == '{"other": 1}'
    assert d.parse_hint(FakeCompletion("<think>only thinking")) is None
    long = d.parse_hint(" ".join(["word"] * 300))
    assert len(long.split()) == d.HINT_MAX_WORDS + 1 and long.endswith("...")


def test_write_hints_is_one_batched_call_aligned_with_its_sources():
    gen = ScriptedDesigner(['{"hint": "A."}', "   ", "Plain C.", "", "<think>x</think>"])
    sources = ["class AEnv: pass", "class BEnv: pass", "class CEnv: pass"]
    assert d.write_hints(sources, "games", Batched(gen)) == ["A.", None, "Plain C."]  # 3 empty replies
    assert [len(b) for b in gen.batches] == [3, 1, 1]  # B asked again, twice: the authors' retry
    assert "The code is hidden from it" in gen.batches[0][0][0]["content"]
    assert "class BEnv" in gen.batches[0][1][1]["content"]
    assert all("class BEnv" in b[0][1]["content"] for b in gen.batches[1:])
    again = ScriptedDesigner(["", "B.", "Late A."])  # a retry that succeeds ends the retries
    assert d.write_hints(sources[:2], "games", Batched(again)) == ["Late A.", "B."]
    assert [len(b) for b in again.batches] == [2, 1]
    tool = ScriptedDesigner(["Ask for the id first."])
    assert d.write_hints(["class CEnv(ToolEnv): pass"], "tool", Batched(tool)) == ["Ask for the id first."]
    assert "never sees the code" in tool.batches[0][0][0]["content"]
    assert d.write_hints([], "games", Batched(gen)) == [] and len(gen.batches) == 3  # no call for none


def test_hint_prompts():
    games = d.hint_messages("class XEnv: pass", "games")
    assert games[1]["content"] == "Environment code:\n```python\nclass XEnv: pass\n```"  # code only
    system = games[0]["content"]
    for needle in ("The code is hidden from it", "added to the\nend of the player's first observation",
                   "reset()", "step()", "answer\nformat", "key insight or strategy",
                   "1-3 sentences, under 100 words", "never code internals", "generic advice",
                   "never state the answer itself", "Good:", "Bad:",
                   "the bare hint text: no JSON, markdown or label"):
        assert needle in system, needle
    assert '{"hint"' not in system
    tool = d.hint_messages("class YEnv(ToolEnv): pass", "tool")
    assert tool[1]["content"] == "Environment code:\n```python\nclass YEnv(ToolEnv): pass\n```"
    for rule in ("never sees the code", "<answer>done</answer> is sent only\n  once the last one",
                 "ask for it instead of guessing", "decline it", "Never write a concrete value",
                 "placeholders such as <order_id>", "distractors", "2-3 sentences", "Good:", "Bad",
                 "the bare hint text: no JSON, markdown or label"):  # the authors' tool-use hint rules
        assert rule in tool[0]["content"], rule


# ----------------------------------------------------------------------------------------------
# end-to-end regeneration with a scripted designer and a subprocess validator

PROBE = r'''
import ast, json, math, sys
src = sys.stdin.read()
def out(ok, kind=None, error=None, cls=None):
    sys.stdout.write("\n" + json.dumps({"ok": ok, "kind": kind, "error": error, "class_name": cls}))
    sys.stdout.flush()
    sys.exit(0)
class Fail(Exception):
    def __init__(self, kind, message):
        super().__init__(message)
        self.kind = kind
names = [n.name for n in ast.parse(src).body if isinstance(n, ast.ClassDef) and n.name.endswith("Env")]
if not names:
    out(False, "no_class", "no Env class")
def transcript():
    ns = {}
    try:
        exec(compile(src, "<env>", "exec"), ns)
        env = ns[names[-1]]()
        obs, info = env.reset(seed=42)
    except BaseException as e:
        raise Fail("reset_error", f"{type(e).__name__}: {e}")
    if type(obs) is not str or not obs or type(info) is not dict:
        raise Fail("invalid_result", "reset must return (str, dict)")
    log = [obs]
    for action in ("\\boxed{1}", "\\boxed{test}", "\\boxed{42}"):
        try:
            o, r, term, trunc, inf = env.step(action)
        except BaseException as e:
            raise Fail("step_error", f"{type(e).__name__}: {e}")
        if type(r) not in (int, float) or not math.isfinite(r) or not -10 <= r <= 10:
            raise Fail("invalid_reward", f"reward {r!r} outside [-10, 10]")
        log.append([o, r, term, trunc])
        if term or trunc:
            break
    return log
try:
    first, second = transcript(), transcript()
except Fail as e:
    out(False, e.kind, str(e), names[-1])
if first != second:
    out(False, "nondeterministic", "same seed, different transcript", names[-1])
out(True, None, None, names[-1])
'''


@dataclass
class Report:
    ok: bool
    kind: str | None
    error: str | None
    class_name: str | None


class SubprocessValidator:
    """A stand-in for Sandbox.validate: the validation probe in a fresh interpreter with a deadline.

    Failure kinds use sandbox.py's names; the designer passes them through as rejection reasons."""

    def __init__(self, workdir, timeout=4.0):
        self.workdir, self.timeout, self.calls = workdir, timeout, []

    def __call__(self, source):
        self.calls.append(len(source))
        try:
            r = subprocess.run([sys.executable, "-I", "-c", PROBE], input=source, capture_output=True,
                               text=True, timeout=self.timeout, cwd=self.workdir, env={"PYTHONHASHSEED": "0"})
        except subprocess.TimeoutExpired:
            return Report(False, "timeout", f"validation exceeded {self.timeout} s", None)
        if r.returncode != 0 or not r.stdout.strip():
            return Report(False, "crash", r.stderr[-300:], None)
        return Report(**json.loads(r.stdout.strip().splitlines()[-1]))


class ScriptedDesigner:
    """generate(list of chats, caps) -> replies, popped in order from a script; records every
    batch (caps: None, a designer or hint stream has no cap of its own here)."""

    def __init__(self, script):
        self.script, self.batches = list(script), []

    def __call__(self, chats, caps):
        self.batches.append(chats)
        replies, self.script = self.script[:len(chats)], self.script[len(chats):]
        return replies


BRACE_BROKEN = env("Compass").replace("Answer as \\\\boxed{{n}}. Turns left", "Answer as \\\\boxed{<n>}. Turns left")
HANG = env("Hang").replace("self.secret = self.rng.randint(1, 50)", "while True:\n            pass")
HUGE_REWARD = env("Jackpot").replace("        guess = int", "        return 'ok', 1e9, False, False, {}\n        guess = int")
NONDETERMINISTIC = env("Dice").replace(  # the first observation leaks an unseeded draw
    "Turns left: {self.max_turns}", "Turns left: {self.max_turns} (noise {random.random()!r})")
EXPLODES = env("Bomb").replace("self.max_turns = max_turns", "raise SystemExit('boom')")


@pytest.fixture
def corpus(tmp_path):
    topics = ["tides", "bees", "bridges", "ciphers", "orchards", "glaciers", "markets", "comets"]
    path = write_corpus(tmp_path / "corpus.jsonl",
                        [json.dumps({"text": f"An essay about {t}.", "id": t}) for t in topics])
    return d.Corpus(path)


def test_end_to_end_regeneration(tmp_path, corpus):
    skills = d.slot_skills(d.active_skills(0, d.GAME_SKILLS, 3, 4), 6)
    assert skills == [MATH, LOGIC, SPATIAL, MATH, LOGIC, SPATIAL]
    code = env("Cut")
    truncated = FakeCompletion("```python\n" + code[:code.index("randint(1, ") + 11], finish_reason="length")
    valid_first = FakeCompletion(f"<think>A guessing game.</think>{fenced(env('Dial'))}")
    script = [
        # attempt 1, slots 0-5
        valid_first,                                                   # 0: valid
        fenced(env("Syntax").replace("def step(self, action):", "def step(self, action)")),  # 1: syntax
        fenced(BRACE_BROKEN),                                          # 2: brace-broken -> repaired, valid
        fenced(HANG),                                                  # 3: hostile: hangs in reset
        fenced("class Game:\n    pass\n"),                             # 4: no Env class
        truncated,                                                     # 5: cut by the token cap
        # attempt 2, failing slots 1, 3, 4, 5
        env("Logic"),                                                  # 1: valid, unfenced
        fenced(HUGE_REWARD),                                           # 3: hostile: reward 1e9
        fenced(NONDETERMINISTIC),                                      # 4: ignores the seed
        "<think>```python\n" + env("Ghost") + "```</think>Done!",      # 5: code only inside thinking
        # attempt 3, failing slots 3, 4, 5
        fenced(env("Vault")),                                          # 3: valid
        fenced(EXPLODES),                                              # 4: raises SystemExit in __init__
        fenced("class Half" + "Env:\n    def reset(self\n"),           # 5: syntax
    ]
    generate, validate = ScriptedDesigner(script), SubprocessValidator(tmp_path)
    reference = d.Corpus(corpus.path)
    proposals, stats = d.regenerate(skills, stream=Batched(generate), validate=validate, corpus=corpus,
                                    memory_block=None, setting="games", rng=random.Random(0), max_attempts=3)

    # one batched generate call per attempt round, only failing slots retried
    assert [len(b) for b in generate.batches] == [6, 4, 3]
    assert [(p.slot, p.attempt) for p in proposals] == [
        (0, 1), (1, 1), (2, 1), (3, 1), (4, 1), (5, 1), (1, 2), (3, 2), (4, 2), (5, 2), (3, 3), (4, 3), (5, 3)]
    # a fresh document per attempt, drawn a round at a time for every slot (so a retry's document
    # never depends on when validations finish), and it is in that attempt's prompt
    draws = [reference.sample().doc_id for _ in range(3 * 6)]
    assert [p.doc_id for p in proposals] == [draws[6 * (p.attempt - 1) + p.slot] for p in proposals]
    assert all(f"An essay about {p.doc_id}." in p.messages[1]["content"] for p in proposals)
    assert all(p.skill == skills[p.slot] and p.skill in p.messages[1]["content"] for p in proposals)

    by = {(p.slot, p.attempt): p for p in proposals}
    assert [(k, by[k].reason) for k in sorted(by)] == [
        ((0, 1), None), ((1, 1), "syntax"), ((1, 2), None), ((2, 1), None), ((3, 1), "timeout"),
        ((3, 2), "invalid_reward"), ((3, 3), None), ((4, 1), "no_class"), ((4, 2), "nondeterministic"),
        ((4, 3), "reset_error"),
        ((5, 1), "truncated"), ((5, 2), "no_code"), ((5, 3), "syntax")]
    accepted = [p for p in proposals if p.ok]
    assert [(p.slot, p.class_name) for p in accepted] == [(0, "DialEnv"), (2, "CompassEnv"), (1, "LogicEnv"), (3, "VaultEnv")]
    assert by[(0, 1)].reply is valid_first and by[(0, 1)].reply.token_ids == [1, 2, 3]
    assert by[(2, 1)].repaired and "\\\\boxed{{<n>}}" in by[(2, 1)].source and not by[(0, 1)].repaired
    assert "outside [-10, 10]" in by[(3, 2)].error and "SystemExit: boom" in by[(4, 3)].error
    assert "line" in by[(1, 1)].error and by[(5, 2)].source is None
    assert len(validate.calls) == 8  # syntax / no class / no code never reach the sandbox
    json.dumps([p.to_log() for p in proposals])  # loggable

    assert stats == {
        "slots": 6, "attempts": 13, "valid": 4,
        "validity_rate": pytest.approx(4 / 13), "first_attempt_validity_rate": pytest.approx(2 / 6),
        "empty_slots": 2, "repaired": 1,
        "rejected/syntax": 2, "rejected/timeout": 1, "rejected/no_class": 1,
        "rejected/truncated": 1, "rejected/invalid_reward": 1, "rejected/reset_error": 1,
        "rejected/nondeterministic": 1,
        "rejected/no_code": 1}

    # hints for the accepted environments, in one batched call
    hint_gen = ScriptedDesigner([json.dumps({"hint": f"Hint {i}."}) for i in range(4)])
    hints = d.write_hints([p.source for p in accepted], "games", Batched(hint_gen))
    assert hints == ["Hint 0.", "Hint 1.", "Hint 2.", "Hint 3."]
    assert len(hint_gen.batches) == 1 and "class DialEnv" in hint_gen.batches[0][0][1]["content"]

    # record how the agent fared; the next Math prompt's memory block reflects it
    outcome = {"DialEnv": (0.5, 0.25), "VaultEnv": (0.95, 0.0), "CompassEnv": (0.3, 0.5), "LogicEnv": (0.05, 0.0)}
    memory = EnvironmentMemory()
    for p in accepted:
        w, regret = outcome[p.class_name]
        memory.add(MemoryRecord(skill=p.skill, source=p.source, win_rate=w, regret=regret, step=0,
                                class_name=p.class_name, setting=p.setting))
    rng = random.Random(1)
    nxt, _ = d.regenerate([MATH, LOGIC], stream=Batched(ScriptedDesigner([fenced(env("Next")), fenced(env("Other"))])),
                          validate=lambda src: Report(True, None, None, None), corpus=corpus,
                          memory_block=lambda skill: seeded(memory, rng).prompt_block(skill), setting="games", rng=rng)
    math_prompt, logic_prompt = (p.messages[1]["content"] for p in nxt)
    tail = math_prompt.split("```python block.", 1)[1]
    assert tail.lstrip().startswith("<REFERENCE_ENVIRONMENTS>")
    assert "DialEnv (skill: Mathematical Reasoning, agent win rate 0.50, regret 0.25)" in tail
    assert "class DialEnv" in tail and "CompassEnv" not in tail  # other skills' records stay out
    assert tail.endswith("Avoid environments like VaultEnv: it was too easy for the agent (win rate 0.95).")
    assert "<REFERENCE_ENVIRONMENTS>" not in logic_prompt
    assert logic_prompt.endswith("Avoid environments like LogicEnv: it was too hard for the agent (win rate 0.05).")
    assert [p.class_name for p in nxt] == ["NextEnv", "OtherEnv"]


def test_tool_regeneration_samples_tasks(corpus):
    seen = []

    def validate(source):
        seen.append(source)
        return Report(True, None, None, "ShopEnv")
    reply = fenced("class ShopEnv(ToolEnv):\n    TOOLS = []\n")
    skills = [s.name for s in d.TOOL_SKILLS]
    props, stats = d.regenerate(skills, stream=Batched(ScriptedDesigner([reply] * 6)), validate=validate,
                                corpus=corpus, memory_block=None, setting="tool", rng=random.Random(5))
    rng = random.Random(5)
    assert [p.task for p in props] == [d.tool_task(rng) for _ in range(6)]
    assert all(f"simulated backend for {p.task[0]}" in p.messages[-1]["content"] for p in props)
    assert len(seen) == 6 and stats["validity_rate"] == 1.0 and stats["empty_slots"] == 0



def test_regeneration_validates_a_round_concurrently():
    """One round's validations run `concurrency` at a time (train.py: the sandbox's `workers`), not
    one probe after another: counted by the validations in flight at once, not by timing."""
    import threading
    lock, state = threading.Lock(), {"now": 0, "max": 0}
    all_in = threading.Barrier(4, timeout=10)

    def validate(source):
        with lock:
            state["now"] += 1
            state["max"] = max(state["max"], state["now"])
        all_in.wait()          # returns only once 4 validations are in flight together
        with lock:
            state["now"] -= 1
        return Report(True, None, None, None)
    replies = [fenced(env(name)) for name in ("Dial", "Lamp", "Gate", "Bell")]
    props, stats = d.regenerate([MATH] * 4, stream=Batched(ScriptedDesigner(replies)), validate=validate,
                                corpus=None, memory_block=None, setting="games",
                                rng=random.Random(0), concurrency=4)
    assert state["max"] == 4 and stats["valid"] == 4
    assert [p.class_name for p in props] == ["DialEnv", "LampEnv", "GateEnv", "BellEnv"]

def test_no_corpus_and_infra_retries():
    calls = []

    def flaky(source):
        calls.append(1)
        if len(calls) < 3:
            raise RuntimeError("could not start a worker")
        return Report(True, None, None, None)
    props, stats = d.regenerate([MATH], stream=Batched(ScriptedDesigner([fenced(env("Dial"))])), validate=flaky,
                                corpus=None, memory_block=None, setting="games", rng=random.Random(0),
                                max_turns=40)
    assert len(calls) == 3 and props[0].ok and props[0].doc_id is None
    prompt = props[0].messages[1]["content"]
    # the turn budget the no-corpus prompt states is the run's --max_turns, as the authors pass it
    assert "REFERENCE_DOCUMENT" not in prompt and "at most 40 turns" in prompt
    assert "about 20-30 turns" in prompt and "max_turns=40" in prompt and "25" not in prompt

    def broken(source):
        raise RuntimeError("sandbox down")
    with pytest.raises(RuntimeError, match="sandbox down"):
        d.regenerate([MATH], stream=Batched(ScriptedDesigner([fenced(env("Dial"))])), validate=broken,
                     corpus=None, memory_block=None, setting="games", rng=random.Random(0))
    with pytest.raises(ValueError, match="replies"):
        d.regenerate([MATH, MATH], stream=Batched(lambda chats, caps: ["x"]), validate=broken,
                     corpus=None, memory_block=None, setting="games", rng=random.Random(0))


def test_corpus_document_titles_for_the_run_logs(tmp_path):
    """A title for report.py's cards: the row's title, else its url, else its first 12 words."""
    words = " ".join(f"w{i}" for i in range(20))
    path = write_corpus(tmp_path / "c.jsonl", [
        json.dumps({"text": "Bees dance.", "title": "Bee dances"}),
        json.dumps({"text": "Tides follow the moon.", "url": "https://example.org/tides"}),
        json.dumps({"text": words})])
    assert [doc.title for doc in d.Corpus(path).documents] == [
        "Bee dances", "https://example.org/tides", " ".join(f"w{i}" for i in range(12)) + " ..."]


class SteppingDesigner:
    """A continuous request stream (as vllm_engine.Requests on vLLM): `replies[(slot, attempt)]` is
    (text, engine steps it takes); collect(wait=False) runs one engine step. Logs events."""

    def __init__(self, replies):
        self.replies, self.running, self.steps, self.log = replies, {}, 0, []

    @property
    def pending(self):
        return len(self.running)

    def submit(self, key, chat):
        text, steps = self.replies[key]
        self.running[key] = [steps, text]
        self.log.append(("submit", key, self.steps))

    def collect(self, wait=True):
        import time
        done = []
        while self.running and not done:
            time.sleep(0.002)
            self.steps += 1
            for key, r in list(self.running.items()):
                r[0] -= 1
                if r[0] == 0:
                    done.append((key, FakeCompletion(self.running.pop(key)[1])))
            if not wait:
                break
        self.log += [("reply", key, self.steps) for key, _ in done]
        return done

    def serve(self, fn):
        return fn()


def test_a_rejected_attempt_is_retried_while_other_attempts_decode():
    """No rounds on a continuous stream: slot 0's short first reply is validated while slot 1's
    long one decodes (the validation waits for engine step 5 to go by), and its retry is
    submitted, decoded and accepted before slot 1's first reply is back."""
    import time
    stream = SteppingDesigner({(0, 1): (fenced(env("Bad")), 2), (0, 2): (fenced(env("Good")), 2),
                               (1, 1): (fenced(env("Slow")), 600)})

    def validate(source):
        if "BadEnv" in source:
            deadline = time.monotonic() + 10
            while stream.steps < 5:  # returns only once the engine has stepped on meanwhile
                assert time.monotonic() < deadline, "decoding waited for the validation"
                time.sleep(0.001)
            return Report(False, "invalid_reward", "reward out of range", None)
        return Report(True, None, None, None)
    props, stats = d.regenerate([MATH, LOGIC], stream=stream, validate=validate, corpus=None,
                                memory_block=None, setting="games", rng=random.Random(0),
                                concurrency=2)
    assert [(p.slot, p.attempt, p.ok) for p in props] == [(0, 1, False), (1, 1, True), (0, 2, True)]
    at = {(kind, key): step for kind, key, step in stream.log}
    assert at["submit", (0, 2)] < at["reply", (0, 2)] < at["reply", (1, 1)] == 600
    assert stats["valid"] == 2 and stats["attempts"] == 3


def test_a_validation_wait_with_nothing_in_flight_goes_through_serve():
    """With no attempt of its own decoding, regenerate waits for its validations through the
    stream's serve (vllm_engine.Requests: a TP member keeps serving its group meanwhile); while
    another attempt decodes it polls them between engine steps instead."""
    stream = SteppingDesigner({(0, 1): (fenced(env("Good")), 2), (1, 1): (fenced(env("Slow")), 9)})
    served = []

    def serve(fn):
        served.append(stream.steps)
        return fn()
    stream.serve = serve
    props, _ = d.regenerate([MATH, LOGIC], stream=stream,
                            validate=lambda src: Report(True, None, None, None), corpus=None,
                            memory_block=None, setting="games", rng=random.Random(0))
    assert [(p.slot, p.ok) for p in props] == [(0, True), (1, True)]
    assert served == [9]  # only after the last reply: slot 0's validation ran during decoding


def test_an_empty_hint_is_asked_again_as_soon_as_it_comes_back():
    """A hint reply with no hint goes back in at once, up to `attempts` requests per environment;
    a batched generate gets one call per attempt."""
    gen = ScriptedDesigner(["", json.dumps({"hint": "B."}), "", "A.", ""])
    assert d.write_hints(["class AEnv: pass", "class BEnv: pass", "class CEnv: pass"], "games",
                         Batched(gen), attempts=2) == ["A.", "B.", None]
    assert [len(b) for b in gen.batches] == [3, 2]
    assert ["class CEnv" in c[1]["content"] for c in gen.batches[1]] == [False, True]


def test_a_retried_hint_does_not_wait_for_the_other_hints():
    stream = SteppingDesigner({(0, 1): ("", 2), (0, 2): ("Go left.", 2), (1, 1): ("Go up.", 50)})
    assert d.write_hints(["class AEnv: pass", "class BEnv: pass"], "games", stream,
                         attempts=3) == ["Go left.", "Go up."]
    at = {(kind, key): step for kind, key, step in stream.log}
    assert at["submit", (0, 2)] == 2 and at["reply", (0, 2)] == 4 < at["reply", (1, 1)] == 50
