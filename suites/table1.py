"""The single-turn suites of SPADE's Table 1: Reasoning-Gym, AIME, GPQA-Diamond, LiveCodeBench.

SPADE (arXiv 2608.19197, Sec. 5 and Table 1) reports, for the games setting, eight cells: AIME 2025
and AIME 2026 (avg@32, T 0.7, top-p 0.8; top-k 20 as the authors' harness; --aime_protocol offline:
the authors' offline driver, avg@64 at T 1.0, top-p 0.95), GPQA-Diamond (8 samples, T 0.7, top-p
0.95 and the authors' option order, boxed letter), LiveCodeBench v6 (pass@1, T 0.2, every test
within 6 s) and four Reasoning-Gym cells. Reasoning-Gym is run as the authors' harness
(spade-rl/spade) runs it: the 100 tasks at the reasoning-gym paper's "hard" settings (table and
cells in data/rg_hard.json; Math = algebra + arithmetic + geometry + graphs, Algorithmic =
algorithmic + code, Cognition = arc + games + cognition, Logic = logic + induction), 8 single-turn
episodes per task, reasoning-gym's default instruction with `<answer>` tags around "Problem: ..."
and a box line, T 0.6 / top-p 0.8 / top-k 20, 8,192 tokens, the last `<answer>` tag read before the
last box, a win is a score of 1.0, an episode whose scorer raises is left out, and the cell is the
pooled win rate. eval.py drives these suites (sampling settings, data files, outputs).

Formulas:
    avg@n   = mean_i ( c_i / n )                       (c_i correct samples of item i, n samples)
    pass@k  = mean_i ( 1 - C(n - c_i, k) / C(n, k) )   (unbiased estimator; pass@1 = avg@n)
    RG cell = sum_tasks wins / sum_tasks episodes      (pooled over the category's tasks)

Symbols: n samples per item, c correct samples, k the pass@k budget.

Deviations (from the paper and the authors' harness, spade-rl/spade):
1. Reasoning-Gym items: task t's episodes are items 0..7 of a dataset seeded by (seed, t's name),
   not the authors' draws from a 500-item dataset; same distribution, other items.
2. The `<answer>` tag and the box are read after the reasoning (`</think>`), not over the whole
   reply.
3. GPQA: the options are shuffled once per question as the authors' offline suite does (one
   Random(42) over the questions in order, options "A." to "D."); the instruction is ours; the
   letter is read from the last box after the reasoning (`\\boxed{(B)}` and `\\boxed{\\text{B}}`
   too), else from the last "answer is X" / "Answer: X" there (authors: the first, anywhere).
4. LiveCodeBench: as the authors' offline run, release_v6 whole (1,055 problems, 2023-05 ..
   2025-04; --lcb_start_date / --lcb_end_date narrow it) and 1 sample at T 0.2 / top-p 0.95 with
   16,384 tokens; their in-loop run used the 2025-01 .. 2025-04 problems. Our own grader: tests
   stop at the first failure; outputs compared line by line, then token by token with numeric
   tokens compared as decimals; each test runs in a fresh sandbox.py worker (no network, files or
   processes of the host). The prompt is the authors' in our words (problem, starter code, one
   ```python block asked for) and the code is their extraction (the last ```python block, else
   the whole text), read after the reasoning (`</think>`) as every suite here (theirs: the whole
   reply).

Dependencies: stdlib, tqdm, reasoning-gym, math-verify; agent.py and sandbox.py.
Test: `pytest tests/test_eval.py`.
"""
from __future__ import annotations

import base64
import io
import json
import math
import os
import pickle
import random
import re
import zlib
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal, InvalidOperation
from pathlib import Path

from tqdm import tqdm

import agent
import sandbox

# ----------------------------------------------------------------------------------------------
# the Reasoning-Gym task table (100 tasks at hard settings, grouped into Table 1's 4 cells)

RG_FILE = Path(__file__).resolve().parents[1] / "data" / "rg_hard.json"
RG_TABLE = json.loads(RG_FILE.read_text(encoding="utf-8"))
RG_CELLS = {cell: tuple(packages) for cell, packages in RG_TABLE["cells"].items()}
# package -> [(task, params)]
RG_HARD_TASKS = {pkg: list(tasks.items()) for pkg, tasks in RG_TABLE["tasks"].items()}

ANSWER_FORMAT = "Please reason step by step, and put your final answer within \\boxed{}."


def _first(row: dict, *keys, default=None):
    """The first of `keys` that `row` has (not None): our field names, else the hub's."""
    return next((row[k] for k in keys if k in row and row[k] is not None), default)


def cell_tasks(cell: str) -> list[tuple[str, str, dict]]:
    """(package, task, params) of one Table-1 Reasoning-Gym cell, in table order."""
    return [(pkg, name, params) for pkg in RG_CELLS[cell] for name, params in RG_HARD_TASKS[pkg]]


# ----------------------------------------------------------------------------------------------
# metrics


def avg_at_n(correct: list[list[float]]) -> float:
    """avg@n: mean over items of the mean over that item's samples."""
    return sum(sum(c) / len(c) for c in correct) / len(correct) if correct else 0.0


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one item with c of n samples correct: 1 - C(n-c, k) / C(n, k)."""
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} with balanced braces after the reasoning, else None
    (agent.py's one-pass scan: linear in the reply)."""
    box = agent.last_balanced_box(agent.after_thinking(text))
    return None if box is None else box.strip()


def rg_answer(text: str) -> str | None:
    """The answer to a Reasoning-Gym item, read as the authors read it: the last <answer> tag after
    the reasoning (case-insensitive), else the last box."""
    tags = re.findall(r"<answer>\s*(.*?)\s*</answer>", agent.after_thinking(text),
                      flags=re.S | re.I)
    return tags[-1].strip() if tags else last_boxed(text)


def rg_prompt(question: str) -> str:
    """The authors' Reasoning-Gym prompt: reasoning-gym's default instruction (its first sentence,
    then the problem, then its answer-format lines), the problem carrying a line asking for a
    box."""
    from reasoning_gym.utils import SYSTEM_PROMPTS
    head, rest = SYSTEM_PROMPTS["default"].split("\n", 1)
    return (f"{head}\nProblem: {question}\n\nPut your final answer within \\boxed{{}}.\n"
            f"{rest.strip()}")


# ----------------------------------------------------------------------------------------------
# the single-turn suites. Each returns (metrics, per-sample records).


def _sample_all(sampler, prompts, *, n, sampling, batch_size, desc):
    """Replies (n per prompt) in chunks of `batch_size` prompts, with a progress bar."""
    replies = []
    with tqdm(total=len(prompts), desc=desc, unit="item") as bar:
        for i in range(0, len(prompts), batch_size):
            chunk = prompts[i:i + batch_size]
            chats = [[{"role": "user", "content": p}] for p in chunk]
            replies += sampler.chat(chats, n=n, **sampling)
            bar.update(len(chunk))
    return replies


def rg_items(tasks: list[tuple[str, str, dict]], episodes: int, seed: int):
    """Deterministic items: task t's episodes are items 0..episodes-1 of a dataset seeded by
    (seed, t's name), so adding or removing a task never changes another task's items."""
    import reasoning_gym
    out = []
    for pkg, name, params in tasks:
        task_seed = seed * 1_000_003 + zlib.crc32(name.encode())
        ds = reasoning_gym.create_dataset(name, size=episodes, seed=task_seed, **params)
        out += [(pkg, name, ds, ds[i]) for i in range(episodes)]
    return out


def run_reasoning_gym(sampler, *, cells=tuple(RG_CELLS), episodes=8, seed=0, sampling,
                      batch_size=256, tasks=None):
    """Table 1's Reasoning-Gym cells: one sample per item, win = score_answer == 1.0, pooled per
    cell."""
    metrics, records, scorer_errors = {}, [], 0
    for cell in cells:
        table = [t for t in cell_tasks(cell) if tasks is None or t[1] in tasks]
        if not table:  # a smoke run's task subset may leave a cell empty: no number, not 0
            continue
        items = rg_items(table, episodes, seed)
        replies = _sample_all(sampler, [rg_prompt(it["question"]) for *_, it in items],
                              n=1, sampling=sampling, batch_size=batch_size,
                              desc=f"reasoning_gym/{cell}")
        wins = played = 0
        for (pkg, name, ds, item), (reply,) in zip(items, replies):
            answer, error, score = rg_answer(reply), None, None
            try:
                score = float(ds.score_answer(answer=answer, entry=item))
            except Exception as err:  # as the authors: a scorer failure drops the episode, counted
                error = repr(err)
            played += error is None
            wins += score is not None and score >= 1.0 - 1e-9
            records.append({"suite": "reasoning_gym", "cell": cell, "task": name, "package": pkg,
                            "question": item["question"], "reference": item["answer"],
                            "reply": reply, "answer": answer, "score": score,
                            "win": bool(score and score >= 1.0 - 1e-9), "scorer_error": error})
        metrics[f"reasoning_gym/{cell}"] = wins / played if played else 0.0
        metrics[f"reasoning_gym/{cell}_episodes"] = played
        scorer_errors += len(items) - played
    metrics["reasoning_gym/scorer_errors"] = scorer_errors
    return metrics, records


def math_equal(reply: str, gold: str, timeout: int = 5) -> bool:
    """math-verify equivalence of the reply's last box and the gold answer, under a timeout."""
    from math_verify import parse, verify
    boxed = last_boxed(reply)
    if boxed is None:
        return False
    try:
        gold_p = parse(f"${gold}$", parsing_timeout=timeout)
        pred_p = parse(f"$\\boxed{{{boxed}}}$", parsing_timeout=timeout)
        return bool(gold_p and pred_p and verify(gold_p, pred_p, timeout_seconds=timeout))
    except Exception:  # math-verify's TimeoutException included
        return False


def run_aime(sampler, rows, *, name, n=32, sampling, batch_size=256, timeout=5):
    """avg@n on AIME: each of n samples correct iff math-verify finds it equal to the answer."""
    prompts = [str(_first(r, "problem", "question", "Problem")) + "\n" + ANSWER_FORMAT
               for r in rows]
    replies = _sample_all(sampler, prompts, n=n, sampling=sampling, batch_size=batch_size,
                          desc=name)
    correct, records = [], []
    for i, (row, samples) in enumerate(zip(rows, replies)):
        gold = str(_first(row, "answer", "Answer"))
        scores = [float(math_equal(s, gold, timeout)) for s in samples]
        correct.append(scores)
        records += [{"suite": name, "id": _first(row, "id", "problem_idx", "ID", default=i),
                     "sample": k, "reference": gold, "reply": s, "answer": last_boxed(s),
                     "score": sc}
                    for k, (s, sc) in enumerate(zip(samples, scores))]
    return {f"{name}/avg@{n}": avg_at_n(correct), f"{name}/items": len(rows)}, records


def gpqa_options(row: dict, rng: random.Random) -> tuple[list[str], int]:
    """The four options in the order `rng` draws (correct first, then the three wrong ones, as
    the hub lists them, shuffled), and the index of the correct one."""
    correct = str(_first(row, "correct_answer", "Correct Answer")).strip()
    wrong = row.get("incorrect_answers") or [row[f"Incorrect Answer {i}"] for i in (1, 2, 3)]
    options = [correct] + [str(w).strip() for w in wrong]
    order = list(range(4))
    rng.shuffle(order)
    return [options[j] for j in order], order.index(0)


def boxed_letter(reply: str) -> str | None:
    """The option letter in the last box: \\boxed{B}, \\boxed{(B)}, \\boxed{\\text{B}},
    \\boxed{B) ...}."""
    boxed = last_boxed(reply)
    if boxed is None:
        return None
    boxed = re.sub(r"\\text(bf)?\{([^}]*)\}", r"\2", boxed).strip()
    m = re.match(r"^\(?([A-D])\)?(?:$|[\s.:)])", boxed)
    return m.group(1) if m else None


def gpqa_letter(reply: str) -> str | None:
    """The chosen option: the boxed letter, else the last "answer is B" / "Answer: B" after the
    reasoning (the authors' fallback reads the same two phrases)."""
    said = re.findall(r"(?i:answer is|answer:)\s*\(?([A-D])\b", agent.after_thinking(reply))
    return boxed_letter(reply) or (said[-1] if said else None)


GPQA_SHUFFLE_SEED = 42  # the authors' offline suite: one Random(42) shuffles the questions in order
GPQA_INSTRUCTION = ("Please reason step by step, and put your final answer within \\boxed{}. The "
                    "final answer is the letter of one option only: \\boxed{A}, \\boxed{B}, "
                    "\\boxed{C} or \\boxed{D}.")


def run_gpqa(sampler, rows, *, n=8, sampling, batch_size=256):
    """GPQA-Diamond avg@n: each question's options in one order (GPQA_SHUFFLE_SEED, questions in
    the given order, so a --limit run keeps them), n samples each; gpqa_letter must match."""
    rng, prompts, keys = random.Random(GPQA_SHUFFLE_SEED), [], []
    for row in rows:
        options, key = gpqa_options(row, rng)
        body = "\n".join(f"{'ABCD'[j]}. {o}" for j, o in enumerate(options))
        question = str(_first(row, "question", "Question")).strip()
        prompts.append(f"{question}\n\n{body}\n\n{GPQA_INSTRUCTION}")
        keys.append("ABCD"[key])
    replies = _sample_all(sampler, prompts, n=n, sampling=sampling, batch_size=batch_size,
                          desc="gpqa_diamond")
    correct, records = [], []
    for i, (row, samples, key) in enumerate(zip(rows, replies, keys)):
        correct.append([float(gpqa_letter(reply) == key) for reply in samples])
        records += [{"suite": "gpqa_diamond", "id": _first(row, "id", "Record ID", default=i),
                     "sample": k, "reference": key, "reply": reply, "answer": gpqa_letter(reply),
                     "score": score} for k, (reply, score) in enumerate(zip(samples, correct[-1]))]
    return {f"gpqa_diamond/avg@{n}": avg_at_n(correct), "gpqa_diamond/items": len(rows)}, records


# ----------------------------------------------------------------------------------------------
# LiveCodeBench. Every test runs the solution as a whole program in a fresh sandbox worker
# (sandbox.Sandbox.run_program): the isolation designer-written environments get, so model-written
# code reads no file outside its scratch dir, reaches no network, starts no process, and is killed
# at the time limit; memory is an address-space limit. Functional tests read their job on stdin.

FUNCTIONAL_RUNNER = r"""
import json, sys
sys.setrecursionlimit(100000)
job = json.load(sys.stdin)
src, func, args = job["src"], job["func"], job["args"]
ns = {"__name__": "__solution__"}
exec("from typing import *\n"
     "import collections, heapq, itertools, math, bisect, functools\n" + src, ns)
target = getattr(ns["Solution"](), func) if "Solution" in ns else ns[func]
result = target(*[json.loads(line) for line in args.split("\n") if line.strip()])
print(json.dumps(result))
"""


def extract_code(reply: str) -> str | None:
    """The last ```python block after the reasoning; without one, that whole text, as the
    authors' harness falls back (None only for an empty reply)."""
    text = agent.after_thinking(reply)
    blocks = re.findall(r"```python\s*\n(.*?)```", text, flags=re.S)
    return blocks[-1] if blocks else (text if text.strip() else None)


def _same_token(a: str, b: str) -> bool:
    if a == b:
        return True
    try:
        return Decimal(a) == Decimal(b)
    except (InvalidOperation, ValueError):
        return False


def stdout_matches(got: str, expected: str) -> bool:
    """Line by line after stripping; a line may differ in whitespace and numeric spelling."""
    g, e = got.strip().splitlines(), expected.strip().splitlines()
    if len(g) != len(e):
        return False
    for gl, el in zip(g, e):
        gt, et = gl.split(), el.split()
        if gl.strip() != el.strip() and (len(gt) != len(et) or not all(map(_same_token, gt, et))):
            return False
    return True


def grade_code(code: str | None, tests: list[dict], *, func_name: str | None = None,
               timeout: float = 6.0, memory_mb: int = 4096, sb=None) -> tuple[bool, str]:
    """All tests pass? Returns (passed, reason of the first failure or "ok"). `sb`: the
    sandbox.Sandbox to run in (None: one is started for this call)."""
    if not code:
        return False, "no_code"
    if sb is None:
        with sandbox.Sandbox(workers=1, step_timeout=timeout, memory_mb=memory_mb, fsize_mb=64,
                             pool=1) as own:
            return grade_code(code, tests, func_name=func_name, timeout=timeout, sb=own)
    for t, test in enumerate(tests):
        functional = test.get("testtype", "stdin") == "functional"
        if functional:
            job = json.dumps({"src": code, "func": func_name or "", "args": test["input"]})
            status, out = sb.run_program(FUNCTIONAL_RUNNER, job, timeout=timeout)
        else:
            status, out = sb.run_program(code, test["input"], timeout=timeout)
        # exception, exit != 0, memory, crash
        status = status if status in ("ok", "timeout") else "error"
        try:
            ok = status == "ok" and (
                json.loads(out.strip().splitlines()[-1]) == json.loads(test["output"])
                if functional else stdout_matches(out, test["output"]))
        except (ValueError, IndexError):
            ok = False
        if not ok:
            return False, f"test {t}: {status if status != 'ok' else 'wrong_answer'}"
    return True, "ok"


class _PlainData(pickle.Unpickler):
    """Hub test data is a pickled JSON string: refuse every global, so a crafted file cannot name
    a callable (the only way a pickle runs code)."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"refusing {module}.{name}: test data must be plain data")


def _plain_unpickle(raw: bytes):
    return _PlainData(io.BytesIO(raw)).load()


def lcb_tests(row: dict) -> list[dict]:
    """Public + private tests of a problem: our JSONL's "tests", or the hub's encoded columns."""
    if "tests" in row:
        return row["tests"]
    tests = json.loads(row["public_test_cases"])
    private = row.get("private_test_cases") or "[]"
    try:
        tests += json.loads(private)
    except ValueError:
        # the hub packs large test sets as base64(zlib(pickle(json))), as LCB's own loader
        # reads them
        tests += json.loads(_plain_unpickle(zlib.decompress(base64.b64decode(private.encode()))))
    return tests


def lcb_prompt(row: dict) -> str:
    """The authors' LiveCodeBench prompt in our words: the problem, the starter code if there is
    one, and one line asking for the whole solution in one ```python block (no input/output
    instruction, no reasoning cue: what stdin or a method call means is the problem's own text)."""
    starter = (row.get("starter_code") or "").strip()
    parts = [row["question_content"].strip()]
    if starter:
        parts.append(f"Code to start from:\n```python\n{starter}\n```")
    return "\n\n".join(parts + ["Give your whole solution as one ```python ... ``` block."])


def run_livecodebench(sampler, rows, *, n=10, sampling, batch_size=256, timeout=6.0, memory_mb=4096,
                      workers=None, start_date="", end_date="", limit=None):
    """pass@1 on LiveCodeBench problems dated in [start_date, end_date) (empty: unbounded; the
    first `limit`)."""
    end = end_date or "9"  # after every date
    dated = [r for r in rows if start_date <= str(r.get("contest_date", start_date))[:10] < end]
    rows = dated[:limit]
    replies = _sample_all(sampler, [lcb_prompt(r) for r in rows], n=n, sampling=sampling,
                          batch_size=batch_size, desc="livecodebench_v6")
    jobs = [(i, k) for i in range(len(rows)) for k in range(n)]
    tests = [lcb_tests(r) for r in rows]  # decoded once per problem, not per sample
    funcs = [r.get("func_name") or json.loads(r.get("metadata") or "{}").get("func_name")
             for r in rows]

    def grade(job):
        i, k = job
        return grade_code(extract_code(replies[i][k]), tests[i], func_name=funcs[i],
                          timeout=timeout, sb=sb)

    workers = workers or os.cpu_count() or 1
    with sandbox.Sandbox(workers=workers, step_timeout=timeout, memory_mb=memory_mb, fsize_mb=64,
                         scratch_mb=2048, pool=workers) as sb, ThreadPoolExecutor(workers) as pool:
        results = list(tqdm(pool.map(grade, jobs), total=len(jobs),
                            desc="livecodebench_v6 grading"))
    correct, records = [[0.0] * n for _ in rows], []
    for (i, k), (passed, reason) in zip(jobs, results):
        correct[i][k] = float(passed)
        records.append({"suite": "livecodebench_v6", "id": rows[i].get("question_id", i),
                        "sample": k, "reply": replies[i][k], "score": float(passed),
                        "reason": reason})
    pass1 = sum(pass_at_k(n, int(sum(c)), 1) for c in correct) / max(len(rows), 1)
    return {"livecodebench_v6/pass@1": pass1, "livecodebench_v6/items": len(rows)}, records
