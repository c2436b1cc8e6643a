"""eval.py: metric arithmetic, the Reasoning-Gym task table, oracle/garbage samplers per suite,
the LiveCodeBench grader under hostile code, BFCL multi-turn ground-truth replay, and the driver."""
import ast
import inspect
import json
import re
import select
import socket
import time
from dataclasses import replace
from pathlib import Path

import pytest

import agent
import eval as E
from suites import table1 as T1
from suites import acebench
from suites import toolbench as T
from scripted import ScriptedSampler

FIXTURES = Path(__file__).parent / "fixtures" / "eval"
SAMPLING = {"temperature": 0.0, "top_p": 1.0, "max_new_tokens": 16, "seed": 0}
QUICK_RG = {"basic_arithmetic", "spell_backward", "color_cube_rotation", "syllogism"}  # one per cell, fast
GARBAGE = ScriptedSampler(lambda messages, k: "I am not sure. \\boxed{}")


def jsonl(name):
    return [json.loads(line) for line in (FIXTURES / name).read_text().splitlines() if line.strip()]


def user_text(messages):
    return next(m["content"] for m in messages if m["role"] == "user")


# ------------------------------------------------------------------------------------- metrics

def test_avg_at_n_hand_computed():
    # item 1: 2 of 4 correct -> 0.5; item 2: 4 of 4 -> 1.0; mean 0.75
    assert T1.avg_at_n([[1, 0, 0, 1], [1, 1, 1, 1]]) == pytest.approx(0.75)
    assert T1.avg_at_n([[0.0] * 32]) == 0.0


def test_pass_at_k_hand_computed():
    assert T1.pass_at_k(4, 2, 1) == pytest.approx(0.5)            # 1 - C(2,1)/C(4,1) = 1 - 2/4
    assert T1.pass_at_k(4, 2, 2) == pytest.approx(1 - 1 / 6)      # 1 - C(2,2)/C(4,2)
    assert T1.pass_at_k(10, 3, 1) == pytest.approx(0.3)           # pass@1 = c/n
    assert T1.pass_at_k(4, 0, 1) == 0.0
    assert T1.pass_at_k(4, 3, 2) == 1.0                           # fewer than k wrong samples


def test_answer_extraction():
    assert T1.last_boxed("<think>\\boxed{1}</think> so \\boxed{\\frac{1}{2}} and \\boxed{3}") == "3"
    assert T1.last_boxed("<think>\\boxed{7}</think> no box") is None
    assert T1.last_boxed("\\boxed{a {b} c} then \\boxed{broken") == "a {b} c"
    assert T1.rg_answer("<answer>north</answer>") == "north"
    assert T1.boxed_letter("\\boxed{\\text{C}}") == "C" and T1.boxed_letter("\\boxed{(B)}") == "B"
    assert T1.boxed_letter("\\boxed{B) Weber}") == "B" and T1.boxed_letter("\\boxed{Both}") is None
    assert T1.math_equal("\\boxed{\\frac{1}{2}}", "0.5") and not T1.math_equal("\\boxed{3}", "0.5")
    assert T1.extract_code("```python\nx=1\n```\ntext\n```python\nprint(2)\n```") == "print(2)\n"


def test_livecodebench_prompt_and_code_as_the_authors_harness():
    """The authors' protocol: the problem, then the starter code if any, then one line asking for
    one ```python block, nothing about stdin or reasoning; the last ```python block is the code,
    and without one the whole reply is (so raw code still runs; another fence is not special)."""
    stdin = T1.lcb_prompt({"question_content": "Sum two numbers.\n", "starter_code": ""})
    assert stdin == "Sum two numbers.\n\nGive your whole solution as one ```python ... ``` block."
    method = T1.lcb_prompt({"question_content": "Add.", "starter_code": "class Solution:\n  ..."})
    assert method.startswith("Add.\n\nCode to start from:\n```python\nclass Solution:\n  ...\n```")
    assert not any(w in stdin + method for w in ("standard input", "Reason", "reason"))
    assert T1.extract_code("<think>```python\nbad\n```</think>print(input())") == "print(input())"
    assert T1.extract_code("```py\nx = 1\n```") == "```py\nx = 1\n```"
    assert T1.extract_code("<think>long</think>  ") is None


# ------------------------------------------------------------------------- Reasoning-Gym table

def test_task_table_integrity():
    import dataclasses
    from reasoning_gym.factory import DATASETS
    names = [name for tasks in T1.RG_HARD_TASKS.values() for name, _ in tasks]
    assert len(names) == 100 and len(set(names)) == 100
    for tasks in T1.RG_HARD_TASKS.values():
        for name, params in tasks:
            assert name in DATASETS, name
            fields = {f.name for f in dataclasses.fields(DATASETS[name][1])}
            assert set(params) <= fields, (name, set(params) - fields)
    packages = [p for cell in T1.RG_CELLS.values() for p in cell]
    assert sorted(packages) == sorted(T1.RG_HARD_TASKS)  # every package in exactly one cell
    counts = {cell: len(T1.cell_tasks(cell)) for cell in T1.RG_CELLS}
    assert counts == {"math": 31, "algorithmic": 36, "cognition": 24, "logic": 9}  # the authors' split


def test_task_table_and_cells_are_the_authors():
    """data/rg_hard.json against a copy of the authors' table (spade-rl/spade, rg_a3_hard.py) and
    their task -> cell map (gem_tasks.py): every parameter of every task, and every task's cell."""
    authors = json.loads((FIXTURES / "rg_authors.json").read_text())
    ours = {name: params for tasks in T1.RG_HARD_TASKS.values() for name, params in tasks}
    assert ours == authors["hard_configs"]
    assert {name: cell for cell in T1.RG_CELLS for _, name, _ in T1.cell_tasks(cell)} == authors["cells"]
    assert dict(T1.RG_HARD_TASKS["games"])["countdown"] == {"max_numbers": 9, "max_target": 1000, "max_value": 100,
                                                            "min_numbers": 3, "min_target": 100, "min_value": 1}


def test_rg_prompt_and_answer_as_the_authors():
    prompt = T1.rg_prompt("What is 2 + 3?")
    assert prompt.startswith("Given a problem, your task is to answer the question by thinking step-by-step")
    assert "\nProblem: What is 2 + 3?\n\nPut your final answer within \\boxed{}.\n" in prompt
    assert prompt.index("Problem:") < prompt.index("<answer>answer here</answer>")
    assert T1.rg_answer("\\boxed{4} <ANSWER> 5 </ANSWER>") == "5"  # the tag wins over a later-read box
    assert T1.rg_answer("<answer>1</answer> then <answer>2</answer>") == "2"
    assert T1.rg_answer("<think><answer>9</answer></think> so \\boxed{7}") == "7"  # no tag after thinking
    assert T1.rg_answer("nothing") is None


def test_item_selection_is_deterministic_and_per_task():
    table = [t for t in T1.cell_tasks("math") if t[1] in ("basic_arithmetic", "chain_sum")]
    a = [it["question"] for *_, it in T1.rg_items(table, 3, seed=0)]
    assert a == [it["question"] for *_, it in T1.rg_items(table, 3, seed=0)]
    assert a != [it["question"] for *_, it in T1.rg_items(table, 3, seed=1)]
    alone = [it["question"] for *_, it in T1.rg_items(table[1:], 3, seed=0)]
    assert alone == a[3:]  # dropping a task leaves the other's items unchanged


def rg_oracle(episodes, seed):
    answers = {}
    for cell in T1.RG_CELLS:
        table = [t for t in T1.cell_tasks(cell) if t[1] in QUICK_RG | {"chain_sum"}]
        answers.update({it["question"]: it["answer"] for *_, it in T1.rg_items(table, episodes, seed)})
    return lambda messages, k: "<think><answer>wrong</answer></think> Final: <answer>%s</answer>" % answers[
        user_text(messages).split("Problem: ", 1)[1].split("\n\nPut your final answer", 1)[0]]


def test_reasoning_gym_oracle_wins_garbage_loses():
    oracle = ScriptedSampler(rg_oracle(2, 0))
    metrics, records = T1.run_reasoning_gym(oracle, episodes=2, seed=0, tasks=QUICK_RG, sampling=SAMPLING)
    assert all(metrics[f"reasoning_gym/{c}"] == 1.0 for c in T1.RG_CELLS)
    assert len(records) == 8 and metrics["reasoning_gym/scorer_errors"] == 0
    metrics, _ = T1.run_reasoning_gym(GARBAGE, episodes=2, seed=0, tasks=QUICK_RG, sampling=SAMPLING)
    assert all(metrics[f"reasoning_gym/{c}"] == 0.0 for c in T1.RG_CELLS)
    metrics, _ = T1.run_reasoning_gym(GARBAGE, episodes=1, seed=0, tasks={"basic_arithmetic"}, sampling=SAMPLING)
    assert "reasoning_gym/math" in metrics and "reasoning_gym/logic" not in metrics  # empty cell: no number


def test_scorer_exception_drops_the_episode_and_is_counted(monkeypatch):
    from reasoning_gym.factory import DATASETS
    cls = DATASETS["basic_arithmetic"][0]
    monkeypatch.setattr(cls, "score_answer", lambda self, answer, entry: 1 / 0)
    metrics, records = T1.run_reasoning_gym(ScriptedSampler(rg_oracle(2, 0)), cells=("math",), episodes=2,
                                           seed=0, tasks={"basic_arithmetic", "chain_sum"}, sampling=SAMPLING)
    # basic_arithmetic's 2 episodes leave the cell; chain_sum's 2 wins are the cell: 2 / 2, not 2 / 4
    assert metrics["reasoning_gym/math"] == 1.0 and metrics["reasoning_gym/math_episodes"] == 2
    assert metrics["reasoning_gym/scorer_errors"] == 2
    assert "ZeroDivisionError" in records[0]["scorer_error"] and records[0]["score"] is None


# -------------------------------------------------------------------------------- AIME / GPQA

def test_aime_oracle_and_garbage():
    rows = jsonl("aime2025.jsonl")
    gold = {r["problem"]: r["answer"] for r in rows}
    oracle = ScriptedSampler(lambda m, k: "\\boxed{%s}" % gold[user_text(m).rsplit("\n", 1)[0]])
    metrics, records = T1.run_aime(oracle, rows, name="aime2025", n=3, sampling=SAMPLING)
    assert metrics["aime2025/avg@3"] == 1.0 and len(records) == 9
    metrics, _ = T1.run_aime(GARBAGE, rows, name="aime2025", n=3, sampling=SAMPLING)
    assert metrics["aime2025/avg@3"] == 0.0


def gpqa_oracle(rows):
    correct = [str(r.get("correct_answer") or r.get("Correct Answer")) for r in rows]

    def reply(messages, k):
        text = user_text(messages)
        letter = next(line[0] for line in text.splitlines() if re.match(r"^[A-D]\. ", line) and line[3:] in correct)
        return f"The answer is \\boxed{{{letter}}}"
    return reply


def test_gpqa_oracle_garbage_and_the_authors_option_order():
    """One option order per question, as the authors' offline suite: a single Random(42) shuffles
    [correct, wrong 1, wrong 2, wrong 3] question after question. Its first two shuffles are
    [2, 1, 3, 0] and [3, 2, 0, 1], so the correct options sit at D and C."""
    rows = jsonl("gpqa_diamond.jsonl")
    sampler = ScriptedSampler(gpqa_oracle(rows))
    metrics, records = T1.run_gpqa(sampler, rows, n=8, sampling=SAMPLING)
    assert metrics["gpqa_diamond/avg@8"] == 1.0 and len(records) == 16
    assert [r["reference"] for r in records] == ["D"] * 8 + ["C"] * 8
    assert [c["n"] for c in sampler.calls] == [8] and sampler.calls[0]["prompts"] == 2  # 8 of one prompt
    metrics, _ = T1.run_gpqa(GARBAGE, rows, n=8, sampling=SAMPLING)
    assert metrics["gpqa_diamond/avg@8"] == 0.0


def test_gpqa_prompt_and_letter_fallback():
    rows = jsonl("gpqa_diamond.jsonl")[1:]
    seen = []
    T1.run_gpqa(ScriptedSampler(lambda m, k: seen.append(user_text(m)) or "?"), rows, n=1, sampling=SAMPLING)
    # alone, this question gets Random(42)'s first shuffle [2, 1, 3, 0] of Weber, Tesla, Henry, Gauss
    assert seen == ["What is the SI unit of magnetic flux?\n\nA. Henry\nB. Tesla\nC. Gauss\nD. Weber\n\n"
                    + T1.GPQA_INSTRUCTION]
    assert "\\boxed{}" in T1.GPQA_INSTRUCTION and "\\boxed{D}" in T1.GPQA_INSTRUCTION
    # the box first, else the last "answer is X" / "Answer: X" after the reasoning
    assert T1.gpqa_letter("So the answer is C.") == "C" and T1.gpqa_letter("Answer: (B)") == "B"
    assert T1.gpqa_letter("<think>the answer is A</think> The answer is D") == "D"
    assert T1.gpqa_letter("the answer is B, no: the answer is C") == "C"
    assert T1.gpqa_letter("the answer is B. \\boxed{A}") == "A"
    assert T1.gpqa_letter("The answer is a mixture") is None and T1.gpqa_letter("no idea") is None


# ----------------------------------------------------------------------------- LiveCodeBench

def lcb_oracle(rows):
    sols = {T1.lcb_prompt(r): r["solution"] for r in rows}
    return ScriptedSampler(lambda m, k: "Here it is.\n```python\n%s```" % sols[user_text(m)])


def test_livecodebench_oracle_garbage_and_window():
    rows = jsonl("livecodebench_v6.jsonl")
    metrics, records = T1.run_livecodebench(lcb_oracle(rows), rows, n=2, sampling=SAMPLING, timeout=5.0, workers=2)
    assert metrics["livecodebench_v6/pass@1"] == 1.0
    assert metrics["livecodebench_v6/items"] == 3  # release_v6 whole by default, as the authors' offline run
    metrics, _ = T1.run_livecodebench(lcb_oracle(rows), rows, n=1, sampling=SAMPLING, timeout=5.0, workers=2,
                                     start_date="2025-02-01", end_date="2025-05-01")
    assert metrics["livecodebench_v6/items"] == 2  # a window drops the 2024 problem
    garbage = ScriptedSampler(lambda m, k: "```python\nprint('no')\n```")
    metrics, records = T1.run_livecodebench(garbage, rows, n=1, sampling=SAMPLING, timeout=5.0, workers=2)
    assert metrics["livecodebench_v6/pass@1"] == 0.0 and all(r["reason"] != "ok" for r in records)


STDIN_TEST = [{"input": "2 3\n", "output": "5\n", "testtype": "stdin"}]


@pytest.mark.timeout(60)
def test_hostile_solution_graded_in_the_sandbox(tmp_path):
    """Each test's expected output is what the attack would print if it worked, so a working attack
    passes the test and a contained one is a wrong answer; the hang must not stall the grader."""
    secret = tmp_path / "token"
    secret.write_text("spade-lcb-secret")
    secret.chmod(0o644)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))                                    # the OS picks the port; kept bound
    listener.listen(4)
    port = listener.getsockname()[1]
    attacks = {
        f"print(open({str(secret)!r}).read())": "spade-lcb-secret",
        f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)\nprint('connected')": "connected",
        "import os\nprint('forked' if os.fork() else 'child')": "forked",
        "import subprocess\nprint(subprocess.run(['echo', 'spawned'], capture_output=True).stdout.decode())": "spawned",
    }
    try:
        for code, would_print in attacks.items():
            tests = [{"input": "", "output": would_print + "\n", "testtype": "stdin"}]
            assert T1.grade_code(code, tests, timeout=5.0)[0] is False, code
        assert not select.select([listener], [], [], 0.2)[0]              # no connection attempt arrived
    finally:
        listener.close()
    t0 = time.monotonic()
    hang = "import os, time\ntry:\n    os.fork()\nexcept OSError:\n    pass\nwhile True:\n    time.sleep(1)\n"
    assert T1.grade_code(hang, STDIN_TEST, timeout=1.0) == (False, "test 0: timeout")
    assert time.monotonic() - t0 < 1.0 + 10.0                          # deadline + a shared CI box's slack


def test_grader_catches_wrong_answers_crashes_and_memory():
    assert T1.grade_code("a, b = map(int, input().split())\nprint(a + b)", STDIN_TEST, timeout=5.0) == (True, "ok")
    assert T1.grade_code("print(6)", STDIN_TEST, timeout=5.0) == (False, "test 0: wrong_answer")
    assert T1.grade_code("raise SystemExit(3)", STDIN_TEST, timeout=5.0) == (False, "test 0: error")
    assert T1.grade_code("x = bytearray(8 << 30)", STDIN_TEST, timeout=5.0, memory_mb=512) == (False, "test 0: error")
    assert T1.grade_code(None, STDIN_TEST) == (False, "no_code")
    functional = [{"input": "[1, 2]\n3", "output": "[1, 2, 3]", "testtype": "functional"}]
    good = "class Solution:\n    def push(self, xs: List[int], x: int) -> List[int]:\n        return xs + [x]\n"
    assert T1.grade_code(good, functional, func_name="push", timeout=5.0) == (True, "ok")
    assert T1.grade_code(good.replace("+ [x]", ""), functional, func_name="push", timeout=5.0)[0] is False


def test_stdout_comparison():
    assert T1.stdout_matches("1 2\n3.50\n", "1  2\n3.5")
    assert not T1.stdout_matches("1 2\n3\n", "1 2\n")
    assert not T1.stdout_matches("abc", "abd")


# -------------------------------------------------------------------------- BFCL multi-turn

def bfcl_oracle(entries):
    """Replays each turn's ground-truth calls in one step, then answers in words."""
    from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING
    import importlib
    by_first = {e["question"][0][0]["content"]: e for e in entries}

    def as_call(src, classes):
        node = ast.parse(src, mode="eval").body
        method = next(getattr(importlib.import_module(CLASS_FILE_PATH_MAPPING[c]), c)
                      for c in classes if hasattr(getattr(importlib.import_module(CLASS_FILE_PATH_MAPPING[c]), c), node.func.id))
        names = [p for p in inspect.signature(getattr(method, node.func.id)).parameters if p != "self"]
        args = {names[i]: ast.literal_eval(a) for i, a in enumerate(node.args)}
        args.update({kw.arg: ast.literal_eval(kw.value) for kw in node.keywords})
        return {"name": node.func.id, "arguments": args}

    def reply(messages, k):
        entry = by_first[messages[0]["content"]]
        if messages[-1]["role"] == "tool":
            return "All done."
        turn = sum(m["role"] == "user" for m in messages) - 1
        calls = [as_call(c, entry["involved_classes"]) for c in entry["ground_truth"][turn]]
        return "".join(f"<tool_call>\n{json.dumps(c)}\n</tool_call>\n" for c in calls) or "I need more details."
    return ScriptedSampler(reply)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("category", E.BFCL_CATEGORIES)
def test_bfcl_ground_truth_replay_scores_100_percent(category):
    pytest.importorskip("bfcl_eval", reason="install with `pip install --no-deps bfcl-eval`")
    entries = E.load_bfcl((category,), limit=3)  # one category per run: categories share first questions
    metrics, records = E.run_bfcl(bfcl_oracle(entries), entries, sampling=SAMPLING)
    assert metrics["bfcl_multi_turn/accuracy"] == 1.0, [r["error_type"] for r in records if not r["score"]]
    assert metrics[f"bfcl_multi_turn/{category.removeprefix('multi_turn_')}"] == 1.0
    metrics, _ = E.run_bfcl(GARBAGE, entries, sampling=SAMPLING)
    assert metrics["bfcl_multi_turn/accuracy"] == 0.0


def bfcl_single_oracle(entries):
    """The first accepted value of every ground-truth argument (Java / JavaScript values as the
    strings the hinted docs ask for); no call on an irrelevance entry."""
    def first(values, as_text):
        v = values[0]
        if isinstance(v, dict):
            return {k: first(x, as_text) for k, x in v.items()}
        return json.dumps(v) if as_text and not isinstance(v, str) else v

    def reply(e):
        as_text = e["category"].endswith(("java", "javascript"))
        calls = [{"name": name, "arguments": {k: first(v, as_text) for k, v in params.items() if v and v[0] != ""}}
                 for call in e["ground_truth"] or [] for name, params in call.items()]
        if e["category"] == "live_relevance":
            calls = [{"name": e["function"][0]["name"], "arguments": {}}]
        return "".join(f"<tool_call>\n{json.dumps(c)}\n</tool_call>\n" for c in calls) or "No tool fits."
    return {e["question"][0][-1]["content"]: reply(e) for e in entries}


@pytest.mark.timeout(120)
def test_bfcl_overall_end_to_end_on_scripted_models(tmp_path):
    """suite bfcl: every single-turn category through bfcl-eval's AST checker plus multi-turn; an
    oracle is right everywhere (overall 0.6: the agentic 40 % is not run and counts 0, as bfcl-eval
    counts it), a model that never calls a tool is right only on irrelevance (overall 0.1)."""
    single = T.load_bfcl_single([c for g in T.BFCL_GROUPS.values() for c in g] + ["live_relevance"], 1)
    answers, multi = bfcl_single_oracle(single), bfcl_oracle(E.load_bfcl(("multi_turn_base",), 1)).fn
    oracle = ScriptedSampler(lambda m, k: answers.get(m[-1]["content"]) or multi(m, k))
    cfg = E.EvalConfig(suites="bfcl", limit=1, bfcl_categories="multi_turn_base", output_dir=str(tmp_path))
    metrics = E.evaluate(cfg, sampler=oracle)["metrics"]
    assert {k: v for k, v in metrics.items() if k != "bfcl/items"} == {
        "bfcl/overall": pytest.approx(0.6), "bfcl/overall_ex_agentic": pytest.approx(1.0),
        **{f"bfcl/{k}": 1.0 for k in [*T.BFCL_GROUPS, "multi_turn", *(c for g in T.BFCL_GROUPS.values() for c in g),
                                      "live_relevance", "multi_turn_base"]}}
    assert metrics["bfcl/items"] == 14
    metrics = E.evaluate(cfg, sampler=GARBAGE)["metrics"]
    assert (metrics["bfcl/irrelevance"], metrics["bfcl/non_live"], metrics["bfcl/live"], metrics["bfcl/multi_turn"]) == (1, 0, 0, 0)
    assert metrics["bfcl/overall"] == pytest.approx(0.1) and metrics["bfcl/overall_ex_agentic"] == pytest.approx(10 / 60)
    records = [json.loads(line) for line in (tmp_path / "samples" / "bfcl.jsonl").read_text().splitlines()]
    assert {r["error_type"] for r in records if not r["score"]} >= {"no tool call", "relevance: no call"}


def test_bfcl_single_turn_scoring():
    (simple,) = T.load_bfcl_single(["simple_python"], 1)
    (irrelevant,) = T.load_bfcl_single(["irrelevance"], 1)
    call = lambda name, **args: f'<tool_call>{json.dumps({"name": name, "arguments": args})}</tool_call>'
    name = simple["function"][0]["name"]
    assert T.bfcl_single_score(simple, call(name, base=10, height=5, unit="units")) == (True, None)
    assert T.bfcl_single_score(simple, call(name, base=10, height=6))[0] is False  # a wrong value
    assert T.bfcl_single_score(simple, call("other", base=10, height=5))[0] is False
    assert T.bfcl_single_score(simple, "The area is 25.") == (False, "no tool call")
    assert T.bfcl_single_score(irrelevant, "None of these tools helps.") == (True, None)
    assert T.bfcl_single_score(irrelevant, call(irrelevant["function"][0]["name"])) == (False, "relevance: call made")


def test_tool_call_parsing_and_call_strings():
    text = ('<think><tool_call>{"name": "x", "arguments": {}}</tool_call></think>'
            '<tool_call>{"name": "cd", "arguments": {"folder": "doc"}}</tool_call><tool_call>{bad json}</tool_call>')
    calls = agent.parse_tool_calls(text)
    assert calls == [{"name": "cd", "arguments": {"folder": "doc"}}]
    assert T.call_string(calls[0]) == "cd(folder='doc')"
    assert T.call_string({"name": "__import__('os').system", "arguments": {}}) is None
    assert T.call_string({"name": "f", "arguments": {"a=1, b": 2}}) is None


# ------------------------------------------------------------------------------- the driver

def test_evaluate_writes_results_samples_and_table(tmp_path):
    lcb_rows, gpqa_rows = jsonl("livecodebench_v6.jsonl"), jsonl("gpqa_diamond.jsonl")
    gold = {r["problem"]: r["answer"] for r in jsonl("aime2025.jsonl")}
    lcb, gpqa, rg = lcb_oracle(lcb_rows).fn, gpqa_oracle(gpqa_rows), rg_oracle(1, 0)

    def oracle(messages, k):
        text = user_text(messages)
        if text.rsplit("\n", 1)[0] in gold:
            return "\\boxed{%s}" % gold[text.rsplit("\n", 1)[0]]
        if "```python" in text:
            return lcb(messages, k)
        if "letter of one option" in text:
            return gpqa(messages, k)
        return rg(messages, k)

    cfg = E.EvalConfig(suites="reasoning_gym,aime2025,aime2026,gpqa_diamond,livecodebench_v6", data_dir=str(FIXTURES),
                       output_dir=str(tmp_path), rg_episodes=1, rg_tasks=",".join(QUICK_RG), aime_samples=2,
                       gpqa_samples=2, lcb_samples=1, lcb_test_timeout=5.0)
    asked = set()  # the AIME fixtures share problems: aime2025 runs first and gets sample 1 wrong

    def half_aime25(messages, k):  # AIME25 right on the first of 2 samples only: 50.0 vs AIME26's 100.0
        text = user_text(messages).rsplit("\n", 1)[0]
        if k and text in gold and text not in asked:
            asked.add(text)
            return "\\boxed{}"
        return oracle(messages, k)

    results = E.evaluate(cfg, sampler=ScriptedSampler(half_aime25))
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["metrics"] == results["metrics"] and saved["config"]["rg_episodes"] == 1
    assert saved["metrics"]["aime2026/avg@2"] == 1.0 and saved["metrics"]["livecodebench_v6/pass@1"] == 1.0
    assert set(saved["timing_s"]) == set(cfg.suites.split(",")) and "reasoning_gym" in saved["notes"]
    assert saved["versions"]["reasoning-gym"] and saved["versions"]["math-verify"]
    assert len((tmp_path / "samples" / "gpqa_diamond.jsonl").read_text().splitlines()) == 4
    row = (tmp_path / "table1.md").read_text().splitlines()
    assert row[0].startswith("| Model | AIME25 | AIME26 |") and saved["metrics"]["aime2025/avg@2"] == 0.5
    avg = (0.5 + 7) / 8
    assert row[2].endswith(" | 50.0" + " | 100.0" * 7 + f" | {100 * avg:.1f} |")


def test_table1_row_maps_every_cell_to_its_metric():
    """A distinct value per cell, so a swapped column (AIME25 <-> AIME26, RG cells) shows."""
    metrics = {"aime2025/avg@32": 0.11, "aime2025/items": 30, "aime2026/avg@32": 0.22,
               "gpqa_diamond/avg@8": 0.33, "livecodebench_v6/pass@1": 0.44, "livecodebench_v6/items": 9,
               "reasoning_gym/math": 0.55, "reasoning_gym/algorithmic": 0.66,
               "reasoning_gym/cognition": 0.77, "reasoning_gym/logic": 0.88, "reasoning_gym/episodes": 800}
    head, _, row = E.table1_row(metrics, "m").splitlines()
    assert head == "| Model | AIME25 | AIME26 | GPQA-D | LCB-v6 | RG-Math | RG-Algo | RG-Cog | RG-Logic | Avg |"
    assert row == "| m | 11.0 | 22.0 | 33.0 | 44.0 | 55.0 | 66.0 | 77.0 | 88.0 | 49.5 |"
    del metrics["reasoning_gym/logic"]
    assert E.table1_row(metrics, "m").splitlines()[2].endswith("| 77.0 | - | - |")


def test_eval_defaults_are_the_papers_protocol():
    """Table 1's protocol (the paper, the authors' harness; eval.py's deviations)."""
    c = E.EvalConfig()
    sampling = {s: E.suite_sampling(s, c) for s in ("aime2025", "gpqa_diamond", "livecodebench_v6", "tau2")}
    assert {k: sampling["aime2025"][k] for k in ("n", "temperature", "top_p", "top_k", "max_new_tokens")} == \
        {"n": 32, "temperature": 0.7, "top_p": 0.8, "top_k": 20, "max_new_tokens": 32768}
    # GPQA as the authors' offline suite (top-p 0.95, 32,768 tokens); LiveCodeBench and tau2 agent
    # turns at their 16,384 tokens
    assert (c.gpqa_samples, c.gpqa_temperature, c.gpqa_top_p) == (8, 0.7, 0.95)
    assert (c.lcb_samples, c.lcb_temperature, c.lcb_top_p, c.lcb_test_timeout) == (1, 0.2, 0.95, 6.0)
    assert [sampling[s]["max_new_tokens"] for s in ("gpqa_diamond", "livecodebench_v6", "tau2")] == \
        [32768, 16384, 16384]
    assert (c.rg_episodes, c.rg_temperature, c.rg_top_p, c.rg_top_k, c.rg_max_new_tokens) == (8, 0.6, 0.8, 20, 8192)
    assert (c.bfcl_temperature, c.max_new_tokens) == (0.0, 32768)
    # ACEBench as the authors ran it: all 17 categories, single-turn T 0.7 / top-p 1 / 16,384 tokens,
    # the Agent roles at ACEBench's defaults (T 0.001, 1,000 tokens), a gpt-4o user simulator
    assert (c.acebench_categories, c.acebench_temperature, c.acebench_max_new_tokens) == ("test_all", 0.7, 16384)
    assert E.suite_sampling("acebench", c)["top_p"] == 1.0 and c.acebench_user_model == "gpt-4o"
    assert c.acebench_agent_max_new_tokens == 1000 and acebench.ROLE_SAMPLING["temperature"] == 0.001
    assert c.acebench_multi_step_language == "en"


def test_aime_offline_protocol_and_explicit_flags_win():
    """--aime_protocol offline: the authors' offline driver (eval_offline/configs/games.yaml):
    64 samples at T 1.0, top-p 0.95, top-k 20; a flag given explicitly still wins."""
    def aime(**kw):
        got = E.suite_sampling("aime2026", E.EvalConfig(**kw))
        return got["n"], got["temperature"], got["top_p"], got["top_k"]
    assert aime(aime_protocol="offline") == (64, 1.0, 0.95, 20)
    assert aime(aime_protocol="offline", aime_samples=8, aime_temperature=0.0) == (8, 0.0, 0.95, 20)
    assert aime(aime_top_p=0.9) == (32, 0.7, 0.9, 20)


def test_run_suite_passes_each_suites_own_sampling(tmp_path):
    """Every suite samples with its own (n, temperature, top-p, top-k, budget): a distinct value per
    knob, read back from what the sampler was called with."""
    cfg = E.EvalConfig(data_dir=str(FIXTURES), output_dir=str(tmp_path), seed=3, limit=1, max_new_tokens=77,
                       rg_episodes=1, rg_tasks="basic_arithmetic", rg_temperature=0.61, rg_top_p=0.91, rg_top_k=21,
                       rg_max_new_tokens=55, aime_samples=2, aime_temperature=0.72, aime_top_p=0.82, aime_top_k=22,
                       gpqa_samples=3, gpqa_temperature=0.73, gpqa_top_p=0.83,
                       lcb_samples=4, lcb_temperature=0.24, lcb_top_p=0.94, lcb_test_timeout=5.0,
                       lcb_max_new_tokens=78,
                       bfcl_categories="multi_turn_base", bfcl_temperature=0.005)
    want = {"reasoning_gym": (1, 0.61, 0.91, 21, 55), "aime2025": (2, 0.72, 0.82, 22, 77),
            "aime2026": (2, 0.72, 0.82, 22, 77), "gpqa_diamond": (3, 0.73, 0.83, -1, 77),
            "livecodebench_v6": (4, 0.24, 0.94, -1, 78), "bfcl_multi_turn": (1, 0.005, 1.0, -1, 77)}
    for suite, (n, t, p, k, budget) in want.items():
        sampler = ScriptedSampler(lambda messages, i: "no idea")
        E.run_suite(suite, sampler, cfg)
        assert sampler.calls, suite
        for call in sampler.calls:
            assert {key: call[key] for key in ("n", "temperature", "top_p", "top_k", "max_new_tokens", "seed")} \
                == {"n": n, "temperature": t, "top_p": p, "top_k": k, "max_new_tokens": budget, "seed": 3}, suite
    gpqa = ScriptedSampler(lambda messages, i: "no idea")
    E.run_suite("gpqa_diamond", gpqa, cfg)
    assert sum(c["prompts"] for c in gpqa.calls) == 1  # 1 question, its 3 samples in one call


class RecordingSampler(ScriptedSampler):
    """Garbage replies; keeps every call's keyword arguments, per suite (told apart by prompt)."""

    def __init__(self):
        super().__init__(lambda m, k: "no idea")
        self.seen = []

    def chat(self, conversations, **kwargs):
        self.seen.append((user_text(conversations[0]), kwargs))
        return super().chat(conversations, **kwargs)


def test_results_record_the_sampling_each_suite_received(tmp_path):
    sampler = RecordingSampler()
    cfg = E.EvalConfig(suites="reasoning_gym,aime2025,gpqa_diamond,livecodebench_v6", data_dir=str(FIXTURES),
                       output_dir=str(tmp_path), rg_episodes=1, rg_tasks="basic_arithmetic", aime_samples=3,
                       gpqa_samples=2, lcb_test_timeout=5.0, seed=7)
    saved = E.evaluate(cfg, sampler=sampler)["sampling"]
    kinds = {"reasoning_gym": "Given a problem", "gpqa_diamond": "letter of one option",
             "livecodebench_v6": "python", "aime2025": ""}
    for suite, marker in kinds.items():
        got = next(kw for text, kw in sampler.seen if marker in text and (marker or "Problem:" not in text))
        assert saved[suite] == {k: v for k, v in got.items() if k != "tools"}, suite
    assert saved["reasoning_gym"] == {"n": 1, "temperature": 0.6, "top_p": 0.8, "top_k": 20, "max_new_tokens": 8192, "seed": 7}
    assert saved["aime2025"] == {"n": 3, "temperature": 0.7, "top_p": 0.8, "top_k": 20, "max_new_tokens": 32768, "seed": 7}
    assert saved["livecodebench_v6"]["n"] == 1 and saved["livecodebench_v6"]["temperature"] == 0.2
    assert json.loads((tmp_path / "results.json").read_text())["sampling"] == saved


def test_missing_dataset_names_the_file_and_the_fix(tmp_path):
    cfg = E.EvalConfig(suites="aime2026", data_dir=str(tmp_path), output_dir=str(tmp_path / "out"))
    with pytest.raises(E.MissingDataset, match=r"aime2026: no .*aime2026\.jsonl.*pip install datasets"):
        E.evaluate(cfg, sampler=GARBAGE)


@pytest.mark.parametrize("flags,said", [
    (["--suites", "aime2025,nosuch"], "eval.py: unknown suite nosuch: use reasoning_gym, aime2025"),
    (["--model", "tiny", "--engine", "transformers", "--suites", "aime2026", "--data_dir", "{tmp}"],
     r"eval.py: aime2026: no .*aime2026\.jsonl"),
    (["--model", "{tmp}", "--suites", "aime2025"],
     "eval.py: cannot load --model .*: the directory .* holds no model \\(no config.json\\)"),
])
def test_user_errors_end_the_cli_in_one_line(tmp_path, flags, said):
    """A mistake of the user's is one line on exit, not a traceback."""
    argv = [f.format(tmp=tmp_path) for f in flags] + ["--output_dir", str(tmp_path / "out")]
    with pytest.raises(SystemExit) as e:
        E.main(argv)
    assert re.match(said, str(e.value)) and "\n" not in str(e.value)


def test_tensor_parallelism_in_one_process_ends_at_once_in_one_line(tmp_path, monkeypatch):
    """vLLM's single-process executor at TP 2 would wait for a second rank that never comes: the
    CLI stops before anything loads, naming the launches that work."""
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    argv = ["--model", str(tmp_path / "saved"), "--engine", "vllm", "--tensor_parallel_size", "2",
            "--suites", "aime2025", "--output_dir", str(tmp_path / "out")]
    with pytest.raises(SystemExit) as e:
        E.main(argv)
    assert str(e.value) == (
        "eval.py: --tensor_parallel_size 2 needs 2 processes, one per GPU, and this launch has 1: "
        "torchrun --nproc_per_node 2 eval.py ..., or serve the model (vllm serve MODEL "
        "--tensor-parallel-size 2) and pass --endpoint")
    monkeypatch.setenv("WORLD_SIZE", "2")  # under torchrun the check lets it through to loading
    with pytest.raises(SystemExit, match=r"eval.py: --model .*saved .* is not in the Hugging Face"):
        E.main(argv)


def test_a_tiny_model_says_it_ignores_engine_and_tensor_parallelism(capsys):
    """tiny is built in memory, so it runs on the transformers engine whatever the flags say;
    the eval says so instead of silently ignoring them."""
    sampler = E.build_sampler(E.EvalConfig(model="tiny", engine="vllm", tensor_parallel_size=2))
    assert type(sampler.engine).__name__ == "TransformersEngine"
    assert capsys.readouterr().err == ("eval.py: tiny is built in memory and runs on the "
                                       "transformers engine (--engine and --tensor_parallel_size "
                                       "apply to a saved model)\n")
    E.build_sampler(E.EvalConfig(model="tiny", engine="transformers"))
    assert capsys.readouterr().err == ""


def test_only_rank_0_writes_the_outputs(tmp_path, monkeypatch):
    """Under torchrun every rank runs the same prompts (one TP engine) and returns the same
    results; rank 0 alone writes them."""
    cfg = E.EvalConfig(suites="aime2025", data_dir=str(FIXTURES), limit=1, aime_samples=1)
    monkeypatch.setenv("RANK", "1")
    other = E.evaluate(replace(cfg, output_dir=str(tmp_path / "rank1")), sampler=GARBAGE)
    assert not (tmp_path / "rank1").exists()
    monkeypatch.setenv("RANK", "0")
    main = E.evaluate(replace(cfg, output_dir=str(tmp_path / "rank0")), sampler=GARBAGE)
    assert other["metrics"] == main["metrics"]
    assert {p.name for p in (tmp_path / "rank0").iterdir()} == {"samples", "results.json",
                                                                "table1.md"}


def test_cli_help_on_every_field():
    from transformers import HfArgumentParser
    parser = HfArgumentParser(E.EvalConfig)
    assert all(action.help for action in parser._actions)
    (cfg,) = parser.parse_args_into_dataclasses(args=["--suites", "aime2025", "--aime_samples", "4"])
    aime = E.suite_sampling("aime2025", cfg)
    assert (aime["n"], aime["top_p"], cfg.lcb_test_timeout) == (4, 0.8, 6.0)


# --------------------------------------------------------------------------------- samplers

def test_engine_sampler_renders_tools_and_groups_samples(tokenizer):
    class FakeEngine:
        def generate(self, prompts, **kwargs):
            self.prompts, self.kwargs = prompts, kwargs
            return [type("C", (), {"text": f"r{i}"}) for i in range(len(prompts))]

    engine = FakeEngine()
    tool = T.bfcl_tool({"name": "lookup", "description": "d", "parameters": {"type": "dict", "properties": {
        "x": {"type": "float"}}, "required": ["x"]}})
    assert tool["function"]["parameters"]["type"] == "object"
    assert tool["function"]["parameters"]["properties"]["x"]["type"] == "number"
    out = E.EngineSampler(engine, tokenizer).chat([[{"role": "user", "content": "hi"}], [{"role": "user", "content": "yo"}]],
                                                  n=2, temperature=0.7, top_p=0.8, top_k=-1, max_new_tokens=5, seed=3,
                                                  tools=[None, [tool]])
    assert out == [["r0", "r1"], ["r2", "r3"]]
    assert engine.prompts[0] == engine.prompts[1] != engine.prompts[2]
    assert "lookup" in tokenizer.decode(engine.prompts[2]) and "lookup" not in tokenizer.decode(engine.prompts[0])
    assert engine.kwargs == {"max_new_tokens": [5] * 4, "temperature": 0.7, "top_p": 0.8, "top_k": -1, "seed": 3}
    short = len(engine.prompts[0]) + 2  # room for 2 tokens after the short prompt, none after the tool prompt
    out = E.EngineSampler(engine, tokenizer, max_context=short).chat(
        [[{"role": "user", "content": "hi"}], [{"role": "user", "content": "yo"}]], n=1, temperature=1.0,
        top_p=1.0, max_new_tokens=5, tools=[None, [tool]])
    assert out == [["r0"], [""]] and engine.kwargs["max_new_tokens"] == [2]


def test_openai_sampler_round_trip_on_loopback(openai_endpoint):
    msg = {"content": "", "tool_calls": [{"id": "a", "type": "function", "function": {
        "name": "cd", "arguments": json.dumps({"folder": "x"})}}]}
    url, seen = openai_endpoint(lambda body: {"choices": [{"message": msg}] * body["n"]})
    sampler = E.OpenAISampler(url, "m", workers=2, timeout=10)
    history = [{"role": "user", "content": "go"},
               {"role": "assistant", "content": 'ok<tool_call>{"name": "ls", "arguments": {}}</tool_call>'},
               {"role": "tool", "content": "a.txt"}]
    out = sampler.chat([history], n=2, temperature=0.5, top_p=0.9, top_k=20, max_new_tokens=7, seed=1)
    assert len(out[0]) == 2 and agent.parse_tool_calls(out[0][0]) == [{"name": "cd", "arguments": {"folder": "x"}}]
    sent = seen[0]["messages"]
    assert sent[1]["tool_calls"][0]["function"]["name"] == "ls" and sent[1]["content"] == "ok"
    assert sent[2]["tool_call_id"] == sent[1]["tool_calls"][0]["id"]
    assert (seen[0]["max_tokens"], seen[0]["top_k"], seen[0]["seed"], seen[0]["n"]) == (7, 20, 1, 2)


def test_lcb_hub_row_decoding():
    import base64
    import pickle
    import zlib
    private = [{"input": "1\n", "output": "2\n", "testtype": "stdin"}]
    packed = base64.b64encode(zlib.compress(pickle.dumps(json.dumps(private)))).decode()
    row = {"public_test_cases": json.dumps(STDIN_TEST), "private_test_cases": packed}
    assert T1.lcb_tests(row) == STDIN_TEST + private


def test_lcb_packed_tests_never_unpickle_code():
    """LiveCodeBench packs private tests as base64(zlib(pickle(json))): plain data decodes, a
    pickle that names a callable is refused instead of run."""
    import os
    import pickle

    assert T1._plain_unpickle(pickle.dumps('[{"input": "1", "output": "2"}]')) == \
        '[{"input": "1", "output": "2"}]'

    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    with pytest.raises(pickle.UnpicklingError, match="refusing"):
        T1._plain_unpickle(pickle.dumps(Evil()))
