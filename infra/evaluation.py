"""The held-out benchmarks during training, `train.py --eval_every K` (infrastructure, none of
Algorithm 1).

SPADE (arXiv 2608.19197) plots held-out benchmarks over training (Figs. 6, 11, 12, 14-16) and
picks the best checkpoint from them. This file runs eval.py's suites inside the run: at step 0,
every K steps and after the last step, on the run's own rollout engine with its current weights
(no reload, no second model; vLLM awake as for rollouts), so the curves and the best step come
from the run itself rather than from `eval.py --checkpoints` over exports afterwards.

    step k's evaluation = eval.py on the weights after k updates (those of exports/step-k),
    before step k's phases; its seconds are time/eval_s, outside time/step_s. The one after the
    last step S is a metrics.jsonl row of its own, charts/step = S.

What runs: eval.evaluate with the EvalConfig of --eval_suites and --eval_args (any eval.py flag but
those naming a model, an engine or an output: the run decides them, REFUSED), through
eval.EngineSampler on the run's engine, so step k's numbers are eval.py's on exports/step-k with
the same flags where the engine samples in the shipped dtype: the tiny models (fp32 weights and
sampling; the test checks every reply), and vLLM (bf16; not compared here). The transformers
engine samples a real model from the fp32 masters, its export is bf16.

Several ranks (RankShare): every sampler call's conversations are cut into contiguous shares, one
per rank; each rank samples its own (under vLLM prompt i keeps the seed, seed + i, it has on one
process) and the replies are gathered in order, so every rank scores every item and holds the same
metrics, which the main process logs as they are. A suite whose next call depends on something
else than the replies (tau2-bench's and ACEBench-Agent's user simulators, an LLM on an endpoint)
runs on one process only.

Outputs (main process): `eval/<suite>/<metric>` (eval.py's keys, e.g. eval/aime2025/avg@32) and
time/eval_s in metrics.jsonl and the trackers; RUN_DIR/eval/step-<k>/ (eval.py's results.json,
samples/<suite>.jsonl with every item's reply and score, table1.md); RUN_DIR/eval/checkpoints.md,
.csv and .json, eval.py's sweep summary over the evaluations so far (eval.write_sweep), naming the
best step as `eval.py --checkpoints` names the best export.

Dependencies: eval.py (its suites' packages, requirements/eval.txt), transformers (its parser).
Test: `pytest tests/test_evaluation.py -m ""` (-m "": its runs too).
"""
from __future__ import annotations

import dataclasses
import json
import shlex
import time
from pathlib import Path

# eval.py's flags that name what the run itself decides: its engine, weights and run directory
REFUSED = ("model", "endpoint", "served_model", "api_key_env", "engine", "tensor_parallel_size",
           "gpu_memory_utilization", "batch_tokens", "checkpoints", "output_dir")


def eval_config(suites: str, args: str, world: int = 1):
    """The EvalConfig of --eval_suites and --eval_args (eval.py's flags, one string); a flag of
    REFUSED, an unknown suite or a suite that cannot split over `world` ranks stops the run."""
    import eval as E
    from transformers import HfArgumentParser
    names = [s.strip() for s in suites.split(",") if s.strip()]
    unknown = [s for s in names if s not in E.SUITES]
    if not names or unknown:
        raise SystemExit(f"--eval_suites: {', '.join(unknown) or 'none given'}: use "
                         f"{', '.join(E.SUITES)}")
    argv = shlex.split(args)
    fields = [f.name for f in dataclasses.fields(E.EvalConfig)]
    given = set()
    for flag in (a[2:].split("=")[0] for a in argv if a.startswith("--")):
        # a flag as argparse reads it: the field of that name, else the one it abbreviates
        given |= set([n for n in fields if n == flag] or [n for n in fields if n.startswith(flag)])
    given = [n for n in REFUSED if n in given]
    if given:
        raise SystemExit(f"--eval_args: --{', --'.join(given)} is the run's own (its engine, "
                         "weights and directory); leave it out")
    parser = HfArgumentParser(E.EvalConfig)
    (cfg,) = parser.parse_args_into_dataclasses(args=argv + ["--suites", ",".join(names)])
    simulated = "tau2" in names or "acebench" in names and cfg.acebench_user_endpoint
    if world > 1 and simulated:
        raise SystemExit("--eval_suites: tau2 and ACEBench-Agent's user simulator would answer "
                         "each rank apart, and their conversations must be one: evaluate them "
                         "with eval.py on the exports (--export_every)")
    return cfg


def share(n: int, rank: int, world: int) -> tuple[int, int]:
    """The contiguous [lo, hi) of n items that `rank` takes of `world` (the first n % world
    ranks one more)."""
    base, extra = divmod(n, world)
    lo = rank * base + min(rank, extra)
    return lo, lo + base + (rank < extra)


class RankShare:
    """eval.py's sampler interface over several ranks: chat() samples this rank's share of the
    conversations (share), ends the engine's phase (a rank with less to do keeps taking part in
    the collectives of FSDP2's lockstep decoding or its TP group's engine steps), and returns
    every rank's replies in order (`gather`, a collective: rank after rank)."""

    def __init__(self, sampler, engine, rank: int, world: int, gather):
        self.sampler, self.engine, self.rank, self.world = sampler, engine, rank, world
        self.gather = gather

    def chat(self, conversations, *, n=1, seed=None, tools=None, **sampling):
        lo, hi = share(len(conversations), self.rank, self.world)
        # prompt i of the flattened call (each conversation n times) keeps its seed, seed + i
        mine = self.sampler.chat(conversations[lo:hi], n=n, tools=tools[lo:hi] if tools else None,
                                 seed=None if seed is None else seed + lo * n, **sampling)
        self.engine.drain()
        return self.gather(mine)


class Evaluation:
    """The run's held-out evaluations: which steps (due), one evaluation (run), the summary."""

    def __init__(self, cfg, *, every: int, steps: int, run_dir: Path, label: str, rank: int = 0,
                 world: int = 1, gather=list):
        self.cfg, self.every, self.steps, self.run_dir = cfg, every, steps, Path(run_dir)
        self.label, self.rank, self.world, self.gather = label, rank, world, gather

    def due(self, step: int) -> bool:
        """Step 0, every K steps, and after the last step (step == S)."""
        return step % self.every == 0 or step == self.steps

    def run(self, step: int, engine, tokenizer, max_context: int) -> dict:
        """The suites on the engine's current weights; returns eval/<suite>/<metric> and
        time/eval_s. The main process writes eval/step-<step>/ and the summary."""
        import eval as E
        start, main = time.perf_counter(), self.rank == 0
        out = self.run_dir / "eval"
        # results.json's config names what ran: the run's model at this step, on its engine
        kind = "vllm" if type(engine).__name__ == "VLLMEngine" else "transformers"
        sub = dataclasses.replace(self.cfg, model=f"{self.label}@step-{step}", engine=kind,
                                  output_dir=str(out / f"step-{step}"),
                                  batch_tokens=getattr(engine, "max_batch_tokens",
                                                       self.cfg.batch_tokens))
        sampler = E.EngineSampler(engine, tokenizer, enable_thinking=self.cfg.enable_thinking,
                                  max_context=min(self.cfg.max_model_len, max_context))
        if self.world > 1:
            sampler = RankShare(sampler, engine, self.rank, self.world, self.gather)
        try:
            results = E.evaluate(sub, sampler, write=main)
        except E.MissingDataset as e:
            raise SystemExit(f"--eval_suites: {e}") from None
        if main:
            E.write_sweep(out, self.summary_rows(step), str(self.run_dir))
        m = {f"eval/{k}": float(v) for k, v in results["metrics"].items()
             if isinstance(v, (int, float)) and not isinstance(v, bool)}
        return {**m, "time/eval_s": time.perf_counter() - start}

    def summary_rows(self, upto: int) -> list[dict]:
        """eval.sweep_row of every evaluation written up to step `upto` (a resumed run's too;
        one from beyond a resume point, about to be redone, is left out)."""
        import eval as E
        rows = []
        for path in (self.run_dir / "eval").glob("step-*/results.json"):
            step = int(path.parent.name[5:])
            if step <= upto:
                metrics = json.loads(path.read_text(encoding="utf-8"))["metrics"]
                rows.append(E.sweep_row(path.parent.name, step, metrics))
        return sorted(rows, key=lambda r: r["step"])


def from_config(cfg, run_dir: Path, rank: int, world: int, gather) -> Evaluation | None:
    """The run's Evaluation (train.py's flags, infra/config.py's RunArgs), or None without
    --eval_every."""
    rargs = cfg.run
    if not rargs.eval_every:
        return None
    return Evaluation(eval_config(rargs.eval_suites, rargs.eval_args, world),
                      every=rargs.eval_every, steps=cfg.loop.steps, run_dir=run_dir,
                      label=cfg.model.model, rank=rank, world=world, gather=gather)
