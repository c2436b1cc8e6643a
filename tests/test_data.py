"""Shipped data: the grounding corpus (data/corpus.jsonl) and the hand-written environments
(data/envs/). Game environments are ours and trusted, so they run in-process here; designer-written
code only ever runs through sandbox.py. Run: pytest tests/test_data.py -q
"""
import ast
import itertools
import json
import math
import random
import re
from collections import Counter, deque
from pathlib import Path

import pytest

import toolenv

DATA = Path(__file__).resolve().parents[1] / "data"
ENVS = DATA / "envs"
MANIFEST = json.loads((ENVS / "manifest.json").read_text(encoding="utf-8"))
GAMES = sorted(f for f, m in MANIFEST.items() if m["setting"] == "games")
TOOLS = sorted(f for f, m in MANIFEST.items() if m["setting"] == "tool")
GAME_SKILLS = {"Mathematical Reasoning", "Logical Deduction", "Spatial Reasoning", "Pattern Recognition",
               "Optimization", "Causal Inference"}
TOOL_SKILLS = {"API Orchestration", "Data Retrieval", "State Modification", "Error Recovery",
               "Tool Selection", "Multi-Step Workflows"}
ALLOWED_IMPORTS = {"math", "random", "re", "json", "itertools", "collections", "functools", "heapq", "string"}


# ---------------------------------------------------------------- corpus

def corpus_records():
    lines = (DATA / "corpus.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def test_corpus_lines_parse_and_have_id_and_text():
    records = corpus_records()
    assert len(records) >= 30
    for rec in records:
        assert isinstance(rec["id"], str) and rec["id"]
        assert isinstance(rec["text"], str)
    ids = [rec["id"] for rec in records]
    assert len(set(ids)) == len(ids)


def test_corpus_documents_are_paragraph_sized():
    for rec in corpus_records():
        words = len(rec["text"].split())
        assert 120 <= words <= 320, (rec["id"], words)


def test_corpus_has_no_blank_lines():
    lines = (DATA / "corpus.jsonl").read_text(encoding="utf-8").splitlines()
    assert all(line.strip() for line in lines)


# ---------------------------------------------------------------- manifest and sources

def test_manifest_matches_files_and_covers_every_skill():
    on_disk = {p.name for p in ENVS.glob("*.py")}
    assert on_disk == set(MANIFEST)
    assert GAME_SKILLS <= {MANIFEST[f]["skill"] for f in GAMES}
    assert len(GAMES) >= 8
    assert len(TOOLS) >= 2 and all(f.startswith("tool_") for f in TOOLS)
    assert all(MANIFEST[f]["skill"] in TOOL_SKILLS for f in TOOLS)


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_source_docstring_class_and_imports(name):
    source = (ENVS / name).read_text(encoding="utf-8")
    tree = ast.parse(source)
    doc = ast.get_docstring(tree)
    assert doc and doc.splitlines()[0].startswith(f"skill: {MANIFEST[name]['skill']}. ")
    # The sandbox picks the last module-level class whose name ends in "Env".
    classes = [n.name for n in tree.body if isinstance(n, ast.ClassDef) and n.name.endswith("Env")]
    assert classes[-1] == MANIFEST[name]["class_name"]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            assert {a.name.split(".")[0] for a in node.names} <= ALLOWED_IMPORTS
        elif isinstance(node, ast.ImportFrom):
            assert node.module.split(".")[0] in ALLOWED_IMPORTS


# ---------------------------------------------------------------- game environments

def load_game(name):
    namespace = {"__name__": f"env_{name[:-3]}"}
    exec(compile((ENVS / name).read_text(encoding="utf-8"), name, "exec"), namespace)
    return namespace[MANIFEST[name]["class_name"]]


def check_step(result):
    assert type(result) is tuple and len(result) == 5
    obs, reward, terminated, truncated, info = result
    assert type(obs) is str and obs.strip()
    assert type(reward) in (int, float) and math.isfinite(reward) and 0.0 <= reward <= 1.0
    assert type(terminated) is bool and type(truncated) is bool and type(info) is dict
    return result


SCRIPT = [r"\boxed{1}", r"\boxed{test}", r"\boxed{42}", r"\boxed{north}", r"\boxed{guess 1234}",
          r"\boxed{query 2}", r"\boxed{add 1}", r"\boxed{toggle A}", r"\boxed{move 5}",
          r"\boxed{weigh 1 2 vs 3 4}", r"\boxed{east}", r"\boxed{7}"]

GARBAGE = ["", "   ", "hello", r"\boxed{}", r"\boxed{", "}", r"\boxed{{{}}}", r"\boxed{\boxed{1}}",
           r"\boxed{-99999999999999999999}", r"\boxed{1e309}", r"\boxed{nan}", "\\boxed{\u4f60\u597d \x00 \U0001f600}",
           r"\boxed{answer}", r"\boxed{answer L1=}", r"\boxed{weigh vs}", r"\boxed{weigh 1 1 vs 2 2}",
           r"\boxed{query 1 2}", r"\boxed{add 99}", r"\boxed{move 0}", r"\boxed{guess 12a4}",
           r"\boxed{remove -1}", r"\boxed{toggle Z}", r"\boxed{add ²}", r"\boxed{move ١}",
           r"\boxed{answer ² heavy}", r"\boxed{answer 1 2 ³}", "x" * 20000, r"\boxed{" + "9" * 5000 + "}"]


def transcript(cls, seed, actions):
    env = cls()
    out = [env.reset(seed=seed)]
    for action in actions:
        out.append(env.step(action))
    return out


@pytest.mark.parametrize("name", GAMES)
def test_game_constructs_and_reset_is_deterministic(name):
    cls = load_game(name)
    obs, info = cls().reset(seed=42)
    assert type(obs) is str and obs.strip() and type(info) is dict
    assert transcript(cls, 42, SCRIPT) == transcript(cls, 42, SCRIPT)
    assert transcript(cls, 123, SCRIPT) == transcript(cls, 123, SCRIPT)
    runs = {repr(transcript(cls, s, SCRIPT)) for s in range(6)}
    assert len(runs) > 1, "the seed should change the episode"
    assert type(cls().reset()[0]) is str  # seed=None works too


@pytest.mark.parametrize("name", GAMES)
def test_game_survives_garbage_and_truncates(name):
    cls = load_game(name)
    env = cls()
    env.reset(seed=7)
    ended = False
    for action in itertools.islice(itertools.cycle(GARBAGE), env.max_turns + 5):
        obs, reward, terminated, truncated, _ = check_step(env.step(action))
        if terminated or truncated:
            assert reward in (0.0, 1.0)
            ended = True
    assert ended, "the turn budget must end the episode"
    check_step(env.step(r"\boxed{1}"))  # stepping a finished episode still answers


WORDS = ["query", "answer", "guess", "weigh", "vs", "add", "remove", "submit", "toggle", "move", "north",
         "east", "heavy", "light", "L1=A", "L2=B", "L3=C", "A", "B", "0", "1", "3", "5", "9", "-4", "1234",
         "6666", "=", ",", "{", "}", "\\boxed{"]


@pytest.mark.parametrize("name", GAMES)
def test_game_survives_random_word_salad(name):
    cls = load_game(name)
    rng = random.Random(0)
    for seed in range(5):
        env = cls()
        env.reset(seed=seed)
        for _ in range(40):
            move = " ".join(rng.choice(WORDS) for _ in range(rng.randint(0, 5)))
            check_step(env.step(f"\\boxed{{{move}}}"))


# Scripted solvers: each plays from the observations only (never reads hidden attributes).

def solve_hidden_polynomial(env, seed):
    env.reset(seed=seed)
    values = {}
    for x in (0, 1, 2):
        obs = env.step(rf"\boxed{{query {x}}}")[0]
        values[x] = int(re.search(rf"f\({x}\) = (-?\d+)\.", obs).group(1))
    c = values[0]
    a = (values[2] - 2 * values[1] + c) // 2  # f(2) - 2 f(1) + f(0) = 2a
    b = values[1] - c - a
    return env.step(rf"\boxed{{answer {a} {b} {c}}}")


def solve_code_breaker(env, seed):
    env.reset(seed=seed)
    candidates = ["".join(p) for p in itertools.product("123456", repeat=4)]
    guess = "1122"
    while True:
        result = env.step(rf"\boxed{{guess {guess}}}")
        if result[2] or result[3]:
            return result
        exact, misplaced = map(int, re.match(rf"{guess}: (\d) exact, (\d) misplaced", result[0]).groups())

        def score(secret, g):
            e = sum(s == t for s, t in zip(secret, g))
            return e, sum((Counter(secret) & Counter(g)).values()) - e
        candidates = [c for c in candidates if score(c, guess) == (exact, misplaced)]
        guess = candidates[0]


def solve_counterfeit_coin(env, seed):
    env.reset(seed=seed)
    hyps = [(c, k) for c in range(1, 10) for k in ("heavy", "light")]

    def reading(hyp, left, right):
        coin, kind = hyp
        sign = 1 if kind == "heavy" else -1
        tilt = sign * ((coin in left) - (coin in right))
        return "left heavier" if tilt > 0 else "right heavier" if tilt < 0 else "balanced"

    weighings = [(left, right) for k in range(1, 5) for left in itertools.combinations(range(1, 10), k)
                 for right in itertools.combinations([c for c in range(1, 10) if c not in left], k)
                 if left[0] < right[0]]
    while len(hyps) > 1:
        left, right = min(weighings, key=lambda w: max(Counter(reading(h, *w) for h in hyps).values()))
        obs = env.step(rf"\boxed{{weigh {' '.join(map(str, left))} vs {' '.join(map(str, right))}}}")[0]
        result = re.search(r"Result: (left heavier|right heavier|balanced)", obs).group(1)
        hyps = [h for h in hyps if reading(h, left, right) == result]
    coin, kind = hyps[0]
    return env.step(rf"\boxed{{answer {coin} {kind}}}")


def solve_fog_maze(env, seed):
    obs, _ = env.reset(seed=seed)
    walls = set()
    moves = {"north": (-1, 0), "south": (1, 0), "east": (0, 1), "west": (0, -1)}
    while True:
        r, c = map(int, re.search(r"You are at \(row (\d), col (\d)\)", obs).groups())
        goal = tuple(map(int, re.search(r"exit is at \(row (\d), col (\d)\)", obs).groups()))
        for name, (dr, dc) in moves.items():
            if re.search(rf"{name}: (wall|edge)", obs):
                walls.add((r + dr, c + dc))
        # Plan on the known map, treating unseen cells as open (free-space assumption).
        prev, queue = {(r, c): None}, deque([(r, c)])
        while queue:
            cur = queue.popleft()
            for dr, dc in moves.values():
                nxt = (cur[0] + dr, cur[1] + dc)
                if 0 <= nxt[0] < 6 and 0 <= nxt[1] < 6 and nxt not in walls and nxt not in prev:
                    prev[nxt] = cur
                    queue.append(nxt)
        cell = goal
        while prev[cell] != (r, c):
            cell = prev[cell]
        step = next(n for n, d in moves.items() if (r + d[0], c + d[1]) == cell)
        result = env.step(rf"\boxed{{{step}}}")
        if result[2] or result[3]:
            return result
        obs = result[0]


def solve_sliding_tiles(env, seed):
    obs, _ = env.reset(seed=seed)
    rows = re.search(r"Board:\n(.+)\n(.+)\n", obs).groups()
    start = tuple(0 if t == "_" else int(t) for row in rows for t in row.split())
    goal = (1, 2, 3, 4, 5, 0)
    prev, queue = {start: None}, deque([start])
    while goal not in prev:
        board = queue.popleft()
        blank = board.index(0)
        r, c = divmod(blank, 3)
        for nr, nc in ((r - 1, c), (r + 1, c), (r, c - 1), (r, c + 1)):
            if 0 <= nr < 2 and 0 <= nc < 3:
                nxt = list(board)
                nxt[blank], nxt[nr * 3 + nc] = nxt[nr * 3 + nc], 0
                nxt = tuple(nxt)
                if nxt not in prev:
                    prev[nxt] = (board, board[nr * 3 + nc])
                    queue.append(nxt)
    tiles, board = [], goal
    while prev[board] is not None:
        board, tile = prev[board]
        tiles.append(tile)
    for tile in reversed(tiles):
        result = env.step(rf"\boxed{{move {tile}}}")
    return result


def sequence_predictions(seq):
    """Candidate next terms, most plausible first: polynomial, linear recurrence, period-2 steps."""
    out = []
    rows = [seq]
    for _ in range(3):
        rows.append([b - a for a, b in zip(rows[-1], rows[-1][1:])])
        if len(set(rows[-1])) == 1:
            out.append(sum(row[-1] for row in rows))
            break
    for p, q in itertools.product(range(-3, 4), repeat=2):
        k = seq[2] - p * seq[1] - q * seq[0]
        if all(seq[i] == p * seq[i - 1] + q * seq[i - 2] + k for i in range(2, len(seq))):
            out.append(p * seq[-1] + q * seq[-2] + k)
    for lag in (1, 2):
        steps = [seq[i] - seq[i - lag] for i in range(lag, len(seq))]
        if all(steps[i] == steps[i - 2] for i in range(2, len(steps))):
            out.append(seq[-lag] + steps[-2])
    return list(dict.fromkeys(out))


def solve_sequence_rounds(env, seed):
    obs, _ = env.reset(seed=seed)
    tried = {}
    while True:
        rnd, shown = re.search(r"Round (\d) of 3\. Sequence: ([-\d, ]+), \?", obs).groups()
        seq = [int(v) for v in shown.split(",")]
        options = [v for v in sequence_predictions(seq) if v not in tried.setdefault(rnd, set())]
        tried[rnd].add(options[0])
        result = env.step(rf"\boxed{{{options[0]}}}")
        if result[2] or result[3]:
            return result
        obs = result[0]


def solve_cargo_loading(env, seed):
    obs, _ = env.reset(seed=seed)
    crates = [(int(i), int(w), int(v)) for i, w, v in re.findall(r"crate (\d+): (\d+) kg, value (\d+)", obs)]
    capacity = int(re.search(r"Load: \d+/(\d+) kg", obs).group(1))
    best = max((s for n in range(len(crates) + 1) for s in itertools.combinations(crates, n)
                if sum(w for _, w, _ in s) <= capacity), key=lambda s: sum(v for _, _, v in s))
    for i, _, _ in best:
        env.step(rf"\boxed{{add {i}}}")
    return env.step(r"\boxed{submit}")


def solve_switchboard(env, seed):
    obs, _ = env.reset(seed=seed)

    def lamps(text):
        return dict(re.findall(r"(L\d)=(on|off)", text))
    before, parent = lamps(obs), {}
    for switch in "ABCD":
        after = lamps(env.step(rf"\boxed{{toggle {switch}}}")[0])
        parent.update({lamp: switch for lamp in after if after[lamp] != before[lamp]})
        before = after
    answer = " ".join(f"{lamp}={parent[lamp]}" for lamp in sorted(parent))
    return env.step(rf"\boxed{{answer {answer}}}")


SOLVERS = {name: globals()[f"solve_{name[:-3]}"] for name in GAMES}


@pytest.mark.parametrize("name", GAMES)
def test_game_is_solvable_by_a_scripted_player(name):
    cls = load_game(name)
    for seed in (0, 1, 2, 3):
        env = cls()
        obs, reward, terminated, truncated, _ = check_step(SOLVERS[name](env, seed))
        assert (reward, terminated, truncated) == (1.0, True, False), (seed, obs)
        assert env.turn <= 25


# ---------------------------------------------------------------- tool-use environments

# The real base class: the environments must work under the contract the sandbox injects.
ToolEnv = toolenv.ToolEnv


def load_tool(name):
    namespace = {"__name__": f"env_{name[:-3]}", "ToolEnv": ToolEnv}
    exec(compile((ENVS / name).read_text(encoding="utf-8"), name, "exec"), namespace)
    return namespace[MANIFEST[name]["class_name"]]


def as_call(call):
    return f"<tool_call>{json.dumps(call)}</tool_call>"


@pytest.mark.parametrize("name", TOOLS)
def test_tool_env_schemas_match_methods(name):
    cls = load_tool(name)
    assert issubclass(cls, ToolEnv)
    for tool in cls.TOOLS:
        assert set(tool) == {"name", "description", "parameters"}
        assert tool["parameters"]["type"] == "object"
        method = getattr(cls, f"tool_{tool['name']}")
        params = method.__code__.co_varnames[1:method.__code__.co_argcount]
        assert set(params) == set(tool["parameters"]["properties"])
        assert set(tool["parameters"].get("required", [])) <= set(params)


@pytest.mark.parametrize("name", TOOLS)
def test_tool_env_solution_replays_to_success(name):
    cls = load_tool(name)
    for seed in (0, 1, 2):
        env = cls()
        first, info = env.reset(seed=seed)
        assert type(first) is str and first.strip() and info["tools"] == env.tools()
        assert 3 <= len(env.instructions) <= 5
        assert not any(pred(env.state) for _, pred in env.instructions)
        assert first == env.instructions[0][0]
        for call in env.solution():
            obs, reward, terminated, truncated, info = env.step(as_call(call))
            assert (reward, terminated, truncated) == (0.0, False, False)
            assert len(info["tool_outputs"]) == 1
        assert all(pred(env.state) for _, pred in env.instructions)
        assert obs.endswith(toolenv.ALL_DONE)  # the last call tells the agent to submit done
        assert env.step("<answer>done</answer>")[1:4] == (1.0, True, False)


@pytest.mark.parametrize("name", TOOLS)
def test_tool_env_is_deterministic_and_rejects_bad_calls(name):
    cls = load_tool(name)
    a, b = cls(), cls()
    assert a.reset(seed=5) == b.reset(seed=5) and a.solution() == b.solution()
    env = cls()
    env.reset(seed=0)
    assert env.step("no tool call here")[1:3] == (-0.1, False)
    bad = [{"name": "no_such_tool", "arguments": {}},
           {"name": env.TOOLS[0]["name"], "arguments": {"bogus": 1}},
           {"name": env.TOOLS[0]["name"], "arguments": []}]
    obs, reward, terminated, _, info = env.step("".join(as_call(c) for c in bad) + "<tool_call>{oops</tool_call>")
    assert (reward, terminated) == (0.0, False) and len(info["tool_outputs"]) == 3
    assert all(out.startswith("Error") for out in info["tool_outputs"])
    obs, reward, terminated, _, _ = env.step("<answer>done</answer>")  # nothing done yet
    assert (reward, terminated) == (0.0, False) and env.instructions[0][0] in obs


def test_shipped_tool_envs_end_with_the_marker_under_the_contract():
    """Under the ToolEnv turn contract (tests/test_tool_use.py): a premature answer pays nothing
    and play goes on; the solution's last tool output alone carries the marker; then it pays."""
    DONE = "<answer>done</answer>"
    for name in TOOLS:
        env = load_tool(name)()
        env.reset(seed=3)
        assert env.step(DONE)[1:3] == (0.0, False)               # premature: play continues
        outs = [env.step(as_call(c))[0] for c in env.solution()]
        assert outs[-1].endswith(toolenv.ALL_DONE) and not any(toolenv.ALL_DONE in o for o in outs[:-1])
        assert env.step(DONE)[1:3] == (1.0, True)
