"""Evaluation: the held-out benchmarks of SPADE's Table 1 and its tool-use result.

SPADE (arXiv 2608.19197, Sec. 5 and Table 1) reports, for the games setting, eight cells: AIME 2025
and 2026, GPQA-Diamond, LiveCodeBench v6 and four Reasoning-Gym cells, whose suites live in
suites/table1.py (protocols, formulas and deviations there). For the tool-use setting it reports
BFCL v4 (suite `bfcl`: overall of non-live, live, irrelevance, multi-turn; `bfcl_multi_turn` alone)
and tau2-bench (`tau2`, its user simulator on --tau2_user_endpoint), whose loops live in
suites/toolbench.py, and ACEBench (`acebench`: Normal, Special, Agent and its summary score;
suites/acebench.py). This file drives all of them against a checkpoint (run.rollout_engine,
train.py's engine choice: vLLM or transformers), an OpenAI-compatible endpoint, or a scripted
sampler (tests): the sampling settings of every suite (written to results.json, "sampling"), the
data files, the outputs (results.json, samples/, table1.md), the best-checkpoint sweep and the
command line.

Data (local JSONL, one object per line; see `load_items` for the accepted field names):
    aime2025.jsonl / aime2026.jsonl  {"id", "problem", "answer"}
    gpqa_diamond.jsonl               {"id", "question", "correct_answer", "incorrect_answers": [3]}
                                     (or the hub's "Question", "Correct Answer",
                                     "Incorrect Answer 1..3")
    livecodebench_v6.jsonl           {"question_id", "question_content", "starter_code",
                                      "contest_date", "tests": [{"input", "output",
                                      "testtype": "stdin"|"functional"}],
                                      "func_name" (functional only)}  (or raw hub rows)
    acebench/data_<category>.json, acebench/possible_answer/data_<category>.json
                                     (ACEBench's data_all/data_en; formats in
                                     suites/acebench.py's docstring)
Reasoning-Gym items are generated offline; BFCL v4 multi-turn data and checker come from the
`bfcl-eval` package (install it with `pip install --no-deps bfcl-eval`: its declared dependencies
are API clients and pinned numpy, none of which the multi-turn checker imports).
When a file is missing and `datasets` is installed and the hub is reachable, the hub copy is
loaded and cached as that JSONL file.

Deviations: suites/table1.py (Table 1), suites/toolbench.py and suites/acebench.py (tool use).

Usage (tensor parallelism: one process per GPU, `torchrun --nproc_per_node 2 eval.py ...
--tensor_parallel_size 2`, every rank running the same prompts, rank 0 writing the outputs; or
serve the model with `vllm serve` and use --endpoint):
    python eval.py --model runs/spade/checkpoint-400 --engine vllm --output_dir runs/eval/spade
    python eval.py --endpoint http://localhost:8000/v1 --model Qwen/Qwen3-8B \
        --suites aime2025,gpqa_diamond
    # every export, best named:
    python eval.py --checkpoints runs/spade --engine vllm --output_dir runs/eval/sweep
    # CPU smoke:
    python eval.py --model tiny --engine transformers --data_dir tests/fixtures/eval --limit 1 \
        --rg_tasks chain_sum --rg_episodes 2 --aime_samples 2 --max_new_tokens 16 \
        --rg_max_new_tokens 16

Dependencies: stdlib, tqdm, transformers (CLI), suites/; lazily: infra/run.py, infra/models.py,
`datasets`/`huggingface_hub` (hub loading), `bfcl_eval` (BFCL).
Test: `pytest tests/test_eval.py`.
"""
from __future__ import annotations

import json
import os
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path


import agent
from suites import MissingDataset, acebench
from suites.table1 import run_aime, run_gpqa, run_livecodebench, run_reasoning_gym
from suites.toolbench import (BFCL_CATEGORIES, TAU2_DOMAINS, load_bfcl, read_jsonl, run_bfcl,
                              run_bfcl_overall, run_tau2)

# ----------------------------------------------------------------------------------------------
# INFRA: samplers. A sampler maps conversations to n reply texts each:
#   sampler.chat(conversations, n=, temperature=, top_p=, max_new_tokens=, seed=, tools=)
#       -> list[list[str]]


class EngineSampler:
    """Renders conversations with the tokenizer's chat template and samples through engine.py.
    A reply's budget shrinks to fit `max_context`; a prompt that leaves no room gets an empty
    reply."""

    def __init__(self, engine, tokenizer, *, enable_thinking: bool | None = None,
                 max_context: int = 40960):
        self.engine, self.tokenizer, self.enable_thinking = engine, tokenizer, enable_thinking
        self.max_context = max_context

    def _prompt(self, messages, tools):
        extra = {} if self.enable_thinking is None else {"enable_thinking": self.enable_thinking}
        # agent.render_chat shows the tools even to a template that drops them
        text = agent.render_chat(self.tokenizer, messages, tools=tools, **extra)
        # The whole rendered text, tokenized as vLLM's chat endpoint and the benchmarks' own
        # harnesses do, so scores compare with published ones (training prompts go through
        # agent.prompt_ids).
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def chat(self, conversations, *, n=1, temperature, top_p, top_k=-1, max_new_tokens, seed=None,
             tools=None):
        tools = tools or [None] * len(conversations)
        prompts = [self._prompt(m, t) for m, t in zip(conversations, tools) for _ in range(n)]
        caps = [min(max_new_tokens, self.max_context - len(p)) for p in prompts]
        fits = [i for i, cap in enumerate(caps) if cap > 0]
        outs = self.engine.generate([prompts[i] for i in fits],
                                    max_new_tokens=[caps[i] for i in fits],
                                    temperature=temperature, top_p=top_p, top_k=top_k, seed=seed)
        texts = [""] * len(prompts)
        for i, out in zip(fits, outs):
            texts[i] = out.text
        return [texts[i * n:(i + 1) * n] for i in range(len(conversations))]


class OpenAISampler:
    """An OpenAI-compatible /chat/completions endpoint (vLLM serve, SGLang, ...) over urllib."""

    def __init__(self, base_url: str, model: str, api_key: str = "", workers: int = 16,
                 timeout: float = 3600):
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model, self.api_key, self.workers, self.timeout = model, api_key, workers, timeout

    def _one(self, messages, tools, n, sampling):
        body = {"model": self.model, "messages": _openai_messages(messages), "n": n, **sampling}
        if tools:
            body["tools"] = tools
        req = urllib.request.Request(self.url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json",
                                              "Authorization": f"Bearer {self.api_key}"})
        with urllib.request.urlopen(req, timeout=self.timeout) as resp:
            choices = json.loads(resp.read())["choices"]
        return [_choice_text(c["message"]) for c in choices]

    def chat(self, conversations, *, n=1, temperature, top_p, top_k=-1, max_new_tokens, seed=None,
             tools=None):
        tools = tools or [None] * len(conversations)
        sampling = {"temperature": temperature, "top_p": top_p, "max_tokens": max_new_tokens}
        if top_k > 0:
            sampling["top_k"] = top_k  # an extension vLLM and SGLang servers accept
        if seed is not None:
            sampling["seed"] = seed
        with ThreadPoolExecutor(self.workers) as pool:
            return list(pool.map(lambda mt: self._one(mt[0], mt[1], n, sampling),
                                 zip(conversations, tools)))


def _choice_text(message: dict) -> str:
    """Endpoint reply as text; structured tool calls become <tool_call> blocks like
    a raw model's."""
    text = message.get("content") or ""
    for call in message.get("tool_calls") or []:
        fn = call["function"]
        args = fn.get("arguments") or "{}"
        args = json.loads(args) if isinstance(args, str) else args
        payload = json.dumps({"name": fn["name"], "arguments": args})
        text += f"\n<tool_call>\n{payload}\n</tool_call>"
    return text


def _openai_messages(messages: list[dict]) -> list[dict]:
    """Turn our text-form tool calls back into the structured form an endpoint expects."""
    out, pending = [], []
    for m in messages:
        if m["role"] == "assistant" and "<tool_call>" in m["content"]:
            calls = agent.parse_tool_calls(m["content"])
            pending = [f"call_{len(out)}_{i}" for i in range(len(calls))]
            out.append({"role": "assistant", "content": m["content"].split("<tool_call>")[0],
                        "tool_calls": [{"id": cid, "type": "function", "function": {
                            "name": c["name"], "arguments": json.dumps(c["arguments"])}}
                            for cid, c in zip(pending, calls)]})
        elif m["role"] == "tool" and pending:
            out.append({"role": "tool", "tool_call_id": pending.pop(0), "content": m["content"]})
        else:
            out.append(dict(m))
    return out


def build_sampler(cfg: "EvalConfig"):
    """The sampler the config asks for: an endpoint, or an engine on a checkpoint directory."""
    if cfg.endpoint:
        key = os.environ.get(cfg.api_key_env, "")
        return OpenAISampler(cfg.endpoint, cfg.served_model or cfg.model, key)
    from infra import models, run  # siblings; heavy imports stay out of the test path
    # tiny models (built in memory) always run on transformers; a saved one can run on vLLM
    tiny = models.is_tiny(cfg.model)
    if tiny and (cfg.engine != "transformers" or cfg.tensor_parallel_size != 1):
        print(f"eval.py: {cfg.model} is built in memory and runs on the transformers engine "
              "(--engine and --tensor_parallel_size apply to a saved model)", file=sys.stderr)
    world, tp = int(os.environ.get("WORLD_SIZE", "1")), cfg.tensor_parallel_size
    use_vllm = cfg.engine == "vllm" and not tiny
    if use_vllm and world % tp:  # one process: vLLM would wait forever
        raise SystemExit(f"eval.py: --tensor_parallel_size {tp} needs {tp} processes, one per "
                         f"GPU, and this launch has {world}: torchrun --nproc_per_node {tp} "
                         f"eval.py ..., or serve the model (vllm serve MODEL "
                         f"--tensor-parallel-size {tp}) and pass --endpoint")
    if use_vllm:  # vLLM loads the weights itself
        from transformers import AutoTokenizer
        model, tokenizer = None, AutoTokenizer.from_pretrained(models.resolve_model_name(cfg.model))
    else:  # in the dtype it ships in (a tiny run's exports: fp32, as the run sampled them)
        model, tokenizer = models.load_model_and_tokenizer(
            cfg.model, dtype=models.shipped_dtype(cfg.model))
    gen = run.rollout_engine(cfg.model, tokenizer, use_vllm=use_vllm, model=model, seed=cfg.seed,
                             max_model_len=cfg.max_model_len,
                             tensor_parallel_size=tp if use_vllm else 1,
                             gpu_memory_utilization=cfg.gpu_memory_utilization,
                             batch_tokens=cfg.batch_tokens, progress=True)
    return EngineSampler(gen, tokenizer, enable_thinking=cfg.enable_thinking,
                         max_context=cfg.max_model_len)


# ----------------------------------------------------------------------------------------------
# INFRA: data. Local JSONL first; the hub only when the file is missing and the hub is usable.

HUB = {  # suite -> (how to fetch, local file name)
    "aime2025": (("datasets", "MathArena/aime_2025", None, "train"), "aime2025.jsonl"),
    "aime2026": (("datasets", "MathArena/aime_2026", None, "train"), "aime2026.jsonl"),
    "gpqa_diamond": (("datasets", "Idavidrein/gpqa", "gpqa_diamond", "train"),
                     "gpqa_diamond.jsonl"),
    # release_v6 is cumulative (1,055 problems, 2023-05 .. 2025-04): release_v1's file plus the
    # five added since
    "livecodebench_v6": (("files", "livecodebench/code_generation_lite",
                          ["test.jsonl", *(f"test{i}.jsonl" for i in range(2, 7))]),
                         "livecodebench_v6.jsonl"),
}


def _from_hub(suite: str) -> list[dict]:
    source = HUB[suite][0]
    if os.environ.get("HF_HUB_OFFLINE") == "1":
        raise RuntimeError("HF_HUB_OFFLINE=1")
    if source[0] == "datasets":
        import datasets  # lazy: optional dependency
        _, name, config, split = source
        return [dict(r) for r in datasets.load_dataset(name, config, split=split)]
    from huggingface_hub import hf_hub_download
    rows = []
    for fname in source[2]:
        rows += read_jsonl(Path(hf_hub_download(source[1], fname, repo_type="dataset")))
    return rows


def load_items(suite: str, data_dir: str | Path) -> list[dict]:
    """Rows of `suite` from `<data_dir>/<file>`; else from the hub (cached to that file)."""
    path = Path(data_dir) / HUB[suite][1]
    if path.exists():
        return read_jsonl(path)
    try:
        rows = _from_hub(suite)
    except Exception as err:  # offline, `datasets` absent, gated repo, ...
        raise MissingDataset(
            f"{suite}: no {path} and the hub copy ({HUB[suite][0][1]}) could not be loaded "
            f"({err!r}). Write the benchmark as JSONL to {path} (formats in eval.py's docstring), "
            "or go online with `pip install datasets` (GPQA is gated: accept its terms and "
            "`huggingface-cli login`).")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, default=str) + "\n" for r in rows), encoding="utf-8")
    return rows


# ----------------------------------------------------------------------------------------------
# INFRA: config, the driver, outputs, CLI

# Known upstream quirks, copied into results.json so a reader of a low cell knows why.
SCORER_NOTES = {
    "reasoning_gym": "graph_color, rubiks_cube, rush_hour and propositional_logic verify a "
                     "submitted solution; their stored reference answer does not score 1.0 (an "
                     "oracle that echoes it loses), a model's valid solution does. An episode "
                     "whose scorer raises is left out of its cell (as the authors do) and "
                     "counted in reasoning_gym/scorer_errors.",
    "aime": "math-verify runs under a per-sample timeout (parse and verify); a timeout counts "
            "as wrong.",
    "livecodebench": "stdout compared line by line, then token-wise with decimal-aware numbers; "
                     "tests stop at the first failure; a test past the time limit fails the "
                     "sample.",
    "acebench": "ACEBench's checker as written: top-level numbers and booleans are type-checked "
                "only, strings lose their whitespace before decoding, an answer class absent "
                "from the state is not checked; the Agent roles sample at T 0.001, top-p 1 "
                "(ACEBench's defaults), --acebench_agent_max_new_tokens each.",
    "bfcl_multi_turn": "bfcl-eval's checker compares environment state and call outputs per "
                       "turn; an entry that hits 20 steps in a turn is force-terminated and "
                       "fails.",
}


SUITES = ("reasoning_gym", "aime2025", "aime2026", "gpqa_diamond", "livecodebench_v6",
          "bfcl_multi_turn", "bfcl", "tau2", "acebench")
TABLE1 = (("AIME25", "aime2025/avg@"), ("AIME26", "aime2026/avg@"), ("GPQA-D", "gpqa_diamond/avg@"),
          ("LCB-v6", "livecodebench_v6/pass@1"), ("RG-Math", "reasoning_gym/math"),
          ("RG-Algo", "reasoning_gym/algorithmic"), ("RG-Cog", "reasoning_gym/cognition"),
          ("RG-Logic", "reasoning_gym/logic"))


@dataclass
class EvalConfig:
    model: str = field(default="tiny", metadata={
        "help": "Checkpoint directory, hub id or alias (Qwen3-4B, Qwen3-8B, Qwen3-30B-A3B), or "
                "tiny; with --endpoint, the served model name."})
    endpoint: str = field(default="", metadata={
        "help": "Base URL of an OpenAI-compatible server (e.g. http://localhost:8000/v1); empty = "
                "load --model through engine.py."})
    served_model: str = field(default="", metadata={
        "help": "Model name to send to --endpoint (default: --model)."})
    api_key_env: str = field(default="OPENAI_API_KEY", metadata={
        "help": "Environment variable holding the endpoint's API key."})
    engine: str = field(default="vllm", metadata={
        "help": "Engine for --model: vllm (GPU) or transformers (CPU / small GPU)."})
    tensor_parallel_size: int = field(default=1, metadata={"help": "vLLM tensor-parallel size."})
    max_model_len: int = field(default=40960, metadata={
        "help": "Context length (prompt + reply); replies are cut to fit it."})
    batch_tokens: int = field(default=65536, metadata={
        "help": "Transformers engine: prompts batched by length up to rows x (longest prompt + "
                "reply cap) tokens, a bound on its KV cache."})
    gpu_memory_utilization: float = field(default=0.85, metadata={
        "help": "vLLM's share of GPU memory (no trainer shares the GPU here)."})
    enable_thinking: bool | None = field(default=None, metadata={
        "help": "Pass enable_thinking to the chat template (hybrid Qwen3); unset = template "
                "default."})
    suites: str = field(default=",".join(SUITES[:5]), metadata={
        "help": f"Comma-separated suites to run, from {', '.join(SUITES)} (default: Table 1's; "
                "the tool-use setting: bfcl,tau2)."})
    data_dir: str = field(default="data/eval", metadata={
        "help": "Directory of the benchmark JSONL files (formats in eval.py's docstring)."})
    output_dir: str = field(default="runs/eval", metadata={
        "help": "Where results.json, samples/*.jsonl and table1.md are written."})
    checkpoints: str = field(default="", metadata={
        "help": "A training run directory: evaluate each policy export in <run>/exports (train.py "
                "--export_every), one row per export, and name the best (the paper's protocol)."})
    seed: int = field(default=0, metadata={
        "help": "Seed of Reasoning-Gym's items and of sampling (GPQA's option order is the "
                "authors': Random(42))."})
    limit: int | None = field(default=None, metadata={
        "help": "Use only the first N items of each dataset suite (smoke runs; not a paper "
                "number)."})
    batch_size: int = field(default=256, metadata={
        "help": "Prompts per sampler call, each sampled n times (the progress bar advances per "
                "call)."})
    max_new_tokens: int = field(default=32768, metadata={
        "help": "Token budget per reply (paper: 32,768-token context)."})
    rg_episodes: int = field(default=8, metadata={
        "help": "Episodes per Reasoning-Gym task (paper: 8)."})
    rg_tasks: str = field(default="", metadata={
        "help": "Comma-separated subset of the 100-task table (smoke runs); empty = all."})
    rg_temperature: float = field(default=0.6, metadata={
        "help": "Reasoning-Gym temperature (the authors' harness: 0.6)."})
    rg_top_p: float = field(default=0.8, metadata={
        "help": "Reasoning-Gym top-p (the authors' harness: 0.8)."})
    rg_top_k: int = field(default=20, metadata={
        "help": "Reasoning-Gym top-k (the authors' harness: 20)."})
    rg_max_new_tokens: int = field(default=8192, metadata={
        "help": "Reasoning-Gym token budget per reply (the authors' harness: 8,192)."})
    aime_protocol: str = field(default="paper", metadata={
        "help": "AIME defaults: paper (avg@32, T 0.7, top-p 0.8, as the paper and the authors' "
                "in-loop config) or offline (avg@64, T 1.0, top-p 0.95: the authors' offline "
                "driver, whose keys their table mapping reads); the three flags below override.",
        "choices": ["paper", "offline"]})
    aime_samples: int | None = field(default=None, metadata={
        "help": "Samples per AIME problem (default: the protocol's, 32 or 64)."})
    aime_temperature: float | None = field(default=None, metadata={
        "help": "AIME temperature (default: the protocol's, 0.7 or 1.0)."})
    aime_top_p: float | None = field(default=None, metadata={
        "help": "AIME top-p (default: the protocol's, 0.8 or 0.95)."})
    aime_top_k: int = field(default=20, metadata={
        "help": "AIME top-k (the authors' harness: 20; -1 = off)."})
    math_verify_timeout: int = field(default=5, metadata={
        "help": "Seconds for math-verify's parse and verify per sample."})
    gpqa_samples: int = field(default=8, metadata={
        "help": "Samples per GPQA-Diamond question (paper: 8)."})
    gpqa_temperature: float = field(default=0.7, metadata={
        "help": "GPQA temperature (paper: 0.7)."})
    gpqa_top_p: float = field(default=0.95, metadata={
        "help": "GPQA top-p (the paper gives none; the authors' offline suite: 0.95)."})
    lcb_samples: int = field(default=1, metadata={
        "help": "Samples per LiveCodeBench problem (the authors' offline run: 1)."})
    lcb_temperature: float = field(default=0.2, metadata={
        "help": "LiveCodeBench temperature (paper: 0.2)."})
    lcb_top_p: float = field(default=0.95, metadata={
        "help": "LiveCodeBench top-p (LCB runner default)."})
    lcb_max_new_tokens: int = field(default=16384, metadata={
        "help": "LiveCodeBench token budget per reply (the authors' offline run: 16,384)."})
    lcb_test_timeout: float = field(default=6.0, metadata={
        "help": "Seconds per test case (paper: 6)."})
    lcb_memory_mb: int = field(default=4096, metadata={
        "help": "Address-space limit per test process, MiB."})
    lcb_start_date: str = field(default="", metadata={
        "help": "First contest date to keep, YYYY-MM-DD (inclusive); empty = no bound (release_v6 "
                "whole, as the authors)."})
    lcb_end_date: str = field(default="", metadata={
        "help": "Contest date to stop before, YYYY-MM-DD (exclusive); empty = no bound."})
    bfcl_categories: str = field(default=",".join(BFCL_CATEGORIES), metadata={
        "help": "BFCL v4 multi-turn categories."})
    bfcl_temperature: float = field(default=0.0, metadata={
        "help": "BFCL temperature (the authors' `bfcl generate --temperature 0.0`; bfcl-eval's own "
                "default: 0.001)."})
    tau2_domains: str = field(default=",".join(TAU2_DOMAINS), metadata={
        "help": "tau2-bench domains (base split of each)."})
    tau2_trials: int = field(default=4, metadata={
        "help": "tau2-bench trials per task (the authors: 4); pass^1 and pass^trials."})
    tau2_max_steps: int = field(default=200, metadata={
        "help": "tau2-bench message limit per conversation (the authors: 200)."})
    tau2_temperature: float = field(default=0.0, metadata={
        "help": "tau2-bench agent temperature (the authors: 0; top-p 0.8, top-k 20)."})
    tau2_max_new_tokens: int = field(default=16384, metadata={
        "help": "tau2-bench token budget per agent message (the authors: 16,384)."})
    tau2_user_endpoint: str = field(default="", metadata={
        "help": "OpenAI-compatible base URL serving tau2-bench's user simulator (required for "
                "suite tau2)."})
    tau2_user_model: str = field(default="gpt-4.1", metadata={
        "help": "Model name of the user simulator at --tau2_user_endpoint (the authors: gpt-4.1, T "
                "0)."})
    tau2_user_api_key_env: str = field(default="OPENAI_API_KEY", metadata={
        "help": "Environment variable holding the user endpoint's API key."})
    acebench_categories: str = field(default="test_all", metadata={
        "help": "ACEBench categories: test_all, groups (normal, special, agent) or category names, "
                "comma-separated."})
    acebench_repo: str = field(default="", metadata={
        "help": "A checkout of github.com/ACEBench/ACEBench: the Agent categories load its API "
                "classes (and its data_all/data_en when <data_dir>/acebench is absent)."})
    acebench_user_endpoint: str = field(default="", metadata={
        "help": "OpenAI-compatible base URL serving ACEBench's user simulator (required for "
                "agent_multi_turn)."})
    acebench_user_model: str = field(default="gpt-4o", metadata={
        "help": "Model name of the ACEBench user simulator (the authors: gpt-4o)."})
    acebench_user_api_key_env: str = field(default="OPENAI_API_KEY", metadata={
        "help": "Environment variable holding the ACEBench user endpoint's API key."})
    acebench_temperature: float = field(default=0.7, metadata={
        "help": "ACEBench single-turn temperature (the authors: 0.7, top-p 1.0)."})
    acebench_max_new_tokens: int = field(default=16384, metadata={
        "help": "ACEBench single-turn token budget (the authors: 16,384)."})
    acebench_agent_max_new_tokens: int = field(default=1000, metadata={
        "help": "ACEBench Agent-role token budget per message (ACEBench's default, kept by the "
                "authors' run: 1,000)."})
    acebench_multi_step_language: str = field(default="en", metadata={
        "help": "Language of the agent_multi_step prompt: en (ACEBench's route for local models, "
                "and the English split's language) or zh (the Chinese prompt the authors' "
                "API-model route sends, in our words).",
        "choices": ["en", "zh"]})


AIME_PROTOCOLS = {"paper": (0.7, 0.8, 32), "offline": (1.0, 0.95, 64)}  # (T, top-p, n); top-k 20


def _aime_sampling(cfg: EvalConfig) -> tuple:
    """AIME's (T, top-p, top-k, n, budget): the protocol's values under any flag given."""
    given = (cfg.aime_temperature, cfg.aime_top_p, cfg.aime_samples)
    t, p, n = (d if x is None else x for x, d in zip(given, AIME_PROTOCOLS[cfg.aime_protocol]))
    return t, p, cfg.aime_top_k, n, cfg.max_new_tokens


def suite_sampling(suite: str, cfg: EvalConfig) -> dict:
    """Samples per item and sampling settings of one suite (top_k -1: off); written to
    results.json."""
    t, p, k, n, budget = {
        "reasoning_gym": (cfg.rg_temperature, cfg.rg_top_p, cfg.rg_top_k, 1, cfg.rg_max_new_tokens),
        "gpqa_diamond": (cfg.gpqa_temperature, cfg.gpqa_top_p, -1, cfg.gpqa_samples,
                         cfg.max_new_tokens),
        "livecodebench_v6": (cfg.lcb_temperature, cfg.lcb_top_p, -1, cfg.lcb_samples,
                             cfg.lcb_max_new_tokens),
        "bfcl_multi_turn": (cfg.bfcl_temperature, 1.0, -1, 1, cfg.max_new_tokens),
        "bfcl": (cfg.bfcl_temperature, 1.0, -1, 1, cfg.max_new_tokens),
        "tau2": (cfg.tau2_temperature, 0.8, 20, cfg.tau2_trials, cfg.tau2_max_new_tokens),
        "acebench": (cfg.acebench_temperature, 1.0, -1, 1, cfg.acebench_max_new_tokens),
    }.get(suite) or _aime_sampling(cfg)
    return {"n": n, "temperature": t, "top_p": p, "top_k": k, "max_new_tokens": budget,
            "seed": cfg.seed}


def run_suite(suite: str, sampler, cfg: EvalConfig) -> tuple[dict, list[dict]]:
    """One suite under the config's protocol."""
    sampling = suite_sampling(suite, cfg)
    n = sampling.pop("n")
    common = {"batch_size": cfg.batch_size, "sampling": sampling}
    if suite == "reasoning_gym":
        tasks = set(cfg.rg_tasks.split(",")) if cfg.rg_tasks else None
        return run_reasoning_gym(sampler, episodes=cfg.rg_episodes, seed=cfg.seed, tasks=tasks,
                                 **common)
    if suite == "bfcl_multi_turn":
        return run_bfcl(sampler, load_bfcl(cfg.bfcl_categories.split(","), cfg.limit), **common)
    if suite == "bfcl":
        return run_bfcl_overall(sampler, limit=cfg.limit,
                                multi_turn=cfg.bfcl_categories.split(","), **common)
    if suite == "tau2":
        if not cfg.tau2_user_endpoint:
            raise MissingDataset("tau2: its user simulator is an LLM: pass --tau2_user_endpoint "
                                 "URL (an OpenAI-compatible server) and --tau2_user_model NAME "
                                 "(the authors: gpt-4.1)")
        user = {"endpoint": cfg.tau2_user_endpoint, "model": cfg.tau2_user_model,
                "api_key": os.environ.get(cfg.tau2_user_api_key_env, "")}
        return run_tau2(sampler, user=user, domains=cfg.tau2_domains.split(","), trials=n,
                        max_steps=cfg.tau2_max_steps, limit=cfg.limit, seed=cfg.seed, **common)
    if suite == "acebench":
        user = OpenAISampler(cfg.acebench_user_endpoint, cfg.acebench_user_model, os.environ.get(
            cfg.acebench_user_api_key_env, "")) if cfg.acebench_user_endpoint else None
        data = Path(cfg.data_dir, "acebench")
        if not data.exists() and cfg.acebench_repo:  # the checkout's own copy
            data = Path(cfg.acebench_repo, "data_all", "data_en")
        return acebench.run_acebench(
            sampler, data_dir=data, categories=cfg.acebench_categories, repo=cfg.acebench_repo,
            user=user, limit=cfg.limit, agent_max_new_tokens=cfg.acebench_agent_max_new_tokens,
            multi_step_language=cfg.acebench_multi_step_language, **common)
    if suite not in SUITES:
        raise ValueError(f"unknown suite {suite!r}: use {', '.join(SUITES)}")
    rows = load_items(suite, cfg.data_dir)
    if suite.startswith("aime"):
        return run_aime(sampler, rows[:cfg.limit], name=suite, n=n,
                        timeout=cfg.math_verify_timeout, **common)
    if suite == "gpqa_diamond":
        return run_gpqa(sampler, rows[:cfg.limit], n=n, **common)
    return run_livecodebench(sampler, rows, n=n, timeout=cfg.lcb_test_timeout,
                             memory_mb=cfg.lcb_memory_mb, start_date=cfg.lcb_start_date,
                             end_date=cfg.lcb_end_date, limit=cfg.limit, **common)


def table1_cells(metrics: dict) -> list[float | None]:
    """The eight Table-1 cells (None where a suite was not run) and, last, the mean of those
    present."""
    cells = [next((v for k, v in metrics.items()
                   if k.startswith(key) and not k.endswith(("items", "episodes"))), None)
             for _, key in TABLE1]
    present = [c for c in cells if c is not None]
    return cells + [sum(present) / len(present) if present else None]


def table1_markdown(rows: list[tuple[str, list]]) -> str:
    """Markdown header + one row per (label, eight cells + average), in percent."""
    head = ["Model", *(name for name, _ in TABLE1), "Avg"]
    body = [[label, *(f"{100 * c:.1f}" if c is not None else "-" for c in cells)]
            for label, cells in rows]
    lines = [head, ["---"] * len(head)] + body
    return "".join("| " + " | ".join(line) + " |\n" for line in lines)


def table1_row(metrics: dict, label: str) -> str:
    """The Table-1 row of one evaluation; the average only when all eight cells were run (the
    paper's)."""
    cells = table1_cells(metrics)
    return table1_markdown([(label, cells if None not in cells[:-1] else cells[:-1] + [None])])


def _versions() -> dict:
    """Versions of the packages whose data or scorers decide the numbers."""
    from importlib.metadata import PackageNotFoundError, version
    out = {}
    for pkg in ("reasoning-gym", "math-verify", "bfcl-eval", "transformers", "vllm"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = None
    return out


def writes() -> bool:
    """Whether this process writes the outputs: under torchrun (tensor parallelism) every rank
    runs the same prompts and rank 0 writes."""
    return int(os.environ.get("RANK", "0")) == 0


def evaluate(cfg: EvalConfig, sampler=None, write: bool | None = None) -> dict:
    """Run the configured suites; write results.json, samples/<suite>.jsonl and table1.md (not
    when `write` is False: train.py's ranks but the main one, infra/evaluation.py; None: rank 0
    of a torchrun launch writes, writes())."""
    out = Path(cfg.output_dir)
    write = writes() if write is None else write
    if write:
        (out / "samples").mkdir(parents=True, exist_ok=True)
    sampler = sampler or build_sampler(cfg)
    metrics, timing, notes = {}, {}, {}
    for suite in [s.strip() for s in cfg.suites.split(",") if s.strip()]:
        start = time.time()
        suite_metrics, records = run_suite(suite, sampler, cfg)
        timing[suite] = round(time.time() - start, 3)
        metrics.update(suite_metrics)
        key = "aime" if suite.startswith("aime") else suite.removesuffix("_v6")
        if key in SCORER_NOTES:
            notes[suite] = SCORER_NOTES[key]
        if write:
            with open(out / "samples" / f"{suite}.jsonl", "w", encoding="utf-8") as f:
                f.writelines(json.dumps(r, default=str) + "\n" for r in records)
    row = table1_row(metrics, Path(cfg.model).name or cfg.model)
    results = {"config": asdict(cfg), "sampling": {s: suite_sampling(s, cfg) for s in timing},
               "metrics": metrics, "timing_s": timing, "notes": notes,
               "versions": _versions(), "table1_markdown": row}
    if write:
        (out / "results.json").write_text(json.dumps(results, indent=2), encoding="utf-8")
        (out / "table1.md").write_text(row, encoding="utf-8")
    return results


def sweep_checkpoints(cfg: EvalConfig, sampler=None) -> dict:
    """The paper's best-checkpoint protocol: every policy export of a training run (train.py
    --export_every, <run>/exports/step-<k>) through the configured suites, each into
    <output_dir>/step-<k>; writes the summary (write_sweep) and names the best export. One engine
    serves every export: the next export's weights are loaded into it."""
    exports = sorted(Path(cfg.checkpoints, "exports").glob("step-*[0-9]"),
                     key=lambda p: int(p.name[5:]))
    if not exports:
        raise MissingDataset("--checkpoints: no policy exports in "
                             f"{Path(cfg.checkpoints, 'exports')}; train with --export_every K "
                             "(and --keep_checkpoints all) to keep them")
    if cfg.endpoint and sampler is None:
        raise ValueError("--checkpoints loads each export itself: drop --endpoint")
    out, rows = Path(cfg.output_dir), []
    for path in exports:
        sub = replace(cfg, model=str(path), checkpoints="", output_dir=str(out / path.name))
        if sampler is None:
            sampler = build_sampler(sub)
        elif hasattr(sampler, "engine"):  # the export's weights into the running engine
            from infra import models
            sampler.engine.sync_weights(models.load_model_and_tokenizer(
                str(path), dtype=models.shipped_dtype(str(path)))[0])
        rows.append(sweep_row(path.name, int(path.name[5:]), evaluate(sub, sampler)["metrics"]))
    return write_sweep(out, rows, cfg.checkpoints, write=writes())


def sweep_row(name: str, step: int, metrics: dict) -> dict:
    """One evaluated checkpoint's row of the sweep: its Table-1 cells and their mean ("Avg", over
    the cells run; None without one), and how many cells ran."""
    *cells, avg = table1_cells(metrics)
    return {"checkpoint": name, "step": step, **dict(zip([n for n, _ in TABLE1], cells)),
            "Avg": avg, "cells": sum(c is not None for c in cells)}


def write_sweep(out: Path, rows: list[dict], run: str, write: bool = True) -> dict:
    """checkpoints.md (one Table-1 row per checkpoint), checkpoints.csv (the cells per step: the
    trajectories) and checkpoints.json in `out`, naming the checkpoint with the best mean of the
    cells run (the eight-benchmark average when all suites run; the first of equals); without
    `write` only the summary (a torchrun rank but 0). Also what train.py --eval_every writes
    after each evaluation (infra/evaluation.py)."""
    import csv
    best = max(rows, key=lambda r: -1.0 if r["Avg"] is None else r["Avg"])
    summary = {"run": run, "rows": rows, "best": best["checkpoint"]}
    if not write:
        return summary
    with open(out / "checkpoints.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    table = table1_markdown([(r["checkpoint"], [r[n] for n, _ in TABLE1] + [r["Avg"]])
                             for r in rows])
    note = (f"\nBest: {best['checkpoint']} (mean of {best['cells']} Table-1 cells: "
            f"{100 * (best['Avg'] or 0):.1f})\n")
    (out / "checkpoints.md").write_text(table + note, encoding="utf-8")
    (out / "checkpoints.json").write_text(json.dumps(summary, indent=2), encoding="utf-8")
    return summary


def main(argv=None):
    """The command line; a user's mistake (an unknown suite, a missing data file, a model that is
    neither on disk nor cached offline) ends it with one line, not a traceback."""
    from transformers import HfArgumentParser
    (cfg,) = HfArgumentParser(EvalConfig).parse_args_into_dataclasses(args=argv)
    unknown = [s.strip() for s in cfg.suites.split(",") if s.strip() and s.strip() not in SUITES]
    if unknown:
        raise SystemExit(f"eval.py: unknown suite {', '.join(unknown)}: use {', '.join(SUITES)}")
    try:
        if cfg.checkpoints:
            summary = sweep_checkpoints(cfg)
            if writes():
                print((Path(cfg.output_dir) / "checkpoints.md").read_text(encoding="utf-8"))
            return summary
        try:
            sampler = build_sampler(cfg)
        except (OSError, ValueError) as e:  # a hub id not cached offline, a dir without a model
            from infra import models
            raise SystemExit(models.cannot_load(cfg.model, e, "eval.py")) from None
        results = evaluate(cfg, sampler)
    except MissingDataset as e:
        raise SystemExit(f"eval.py: {e}") from None
    if writes():
        print(json.dumps(results["metrics"], indent=2))
        print(results["table1_markdown"])


if __name__ == "__main__":
    main()
