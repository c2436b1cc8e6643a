"""The Fixed-env GRPO baseline (arXiv 2608.19197, Sec. 4) and the pools that a run's designer did
not write: the baseline trains the agent on a static pool, and a thin regeneration is topped up
from a hand-written one (train.py's deviation 1).

Everything of the baseline is here: its pool, written once by the untrained policy with the
designer's prompts (`generate_pool`, --generate_pool), the per-step draws without replacement from
it (`fixed_env_schedule`, `fixed_draws`, the authors' seed 42), the loop's calendar that turns the
designer off for it (`Schedule`: train.py asks it, never the flag), and the checks of its flags
(`check`). Both pools take a comma-separated list of sources (`--fixed_envs`, `--fallback_envs`):
a directory of *.py environments (skills from DIR/manifest.json or a `skill: <name>.` first
docstring line), each validated in the sandbox, or an imported id (gem:, gymnasium:, openenv:;
infra/imported.py).

Deviations (README rows 1 and 34): every pool file passes the sandbox's validation (a file that
imports math_verify cannot load in a worker); --generate_pool takes the six skills in turn; a file
with no skill named in a manifest or its docstring gets skill "unknown".
Test: `pytest tests/test_recipe.py tests/test_export.py -m ""` (-m "": the runs too).
"""
from __future__ import annotations

import json
import random
from pathlib import Path

import torch
from tqdm.auto import tqdm

import designer
from infra import config, imported, models, openenv, run, rundir, sampling


def split(specs: str | None) -> list[str]:
    return [s.strip() for s in (specs or "").split(",") if s.strip()]


def check(pools: config.PoolArgs, dargs: config.DesignerArgs) -> None:
    """Fail fast, before any model loads, on pool flags that cannot work."""
    for flag, specs in (("fixed_envs", pools.fixed_envs), ("fallback_envs", dargs.fallback_envs)):
        for spec in split(specs):
            if spec.startswith("openenv:"):
                openenv.remote_url(spec)  # a one-line error for a URL not on this machine
            if not imported.is_imported(spec) and not sorted(Path(spec).glob("*.py")):
                raise SystemExit(f"--{flag} {spec}: no *.py environments there")
    if pools.memory_from and (dargs.no_memory or not Path(pools.memory_from).is_dir()):
        raise SystemExit(f"--memory_from {pools.memory_from}: " + (
            "--no_memory keeps no memory to seed" if dargs.no_memory else "not a directory"))


def generate_pool(cfg: config.Config, *, sb, skills: list[str]) -> Path:
    """The Fixed-env GRPO baseline's pool (Sec. 4): the untrained policy designs environments
    with the same prompts (memory off, skills in turn) until --generate_pool of them validate.
    Each one is written as it validates, with manifest.json (file -> skill, setting) and the
    generator's state, so a killed run continues where it stopped; then `--fixed_envs DIR`.
    `skills`: the setting's skill names, designed in turn."""
    loop, dargs, seed = cfg.loop, cfg.designer, cfg.run.seed
    out, n = Path(cfg.run.output_dir), cfg.pools.generate_pool
    out.mkdir(parents=True, exist_ok=True)
    manifest_path, state_path = out / "manifest.json", out / "pool_state.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    state = json.loads(state_path.read_text()) if state_path.exists() else {}
    dtype = torch.bfloat16 if torch.cuda.is_available() else torch.float32
    model, tok = models.load_model_and_tokenizer(cfg.model.model, dtype=dtype, seed=seed)
    eng = run.make_engine(cfg, model, tok, seed, False)
    sampler = sampling.Sampler(eng, tok, seed)
    corpus = None if dargs.no_corpus else designer.Corpus(
        dargs.corpus, max_words=designer.CORPUS_MAX_WORDS[loop.setting], seed=dargs.corpus_seed)
    if corpus is not None and state.get("corpus"):
        corpus.load_state_dict(state["corpus"])
    rnd = state.get("round", 0)
    bar, dry = tqdm(total=n, initial=min(len(manifest), n), desc="pool"), 0
    while len(manifest) < n:
        if dry == 10:
            raise SystemExit(f"--generate_pool: 10 rounds without a valid environment "
                             f"({len(manifest)} of {n} in {out})")
        batch = min(loop.num_envs, n - len(manifest))
        slots = [skills[(rnd * loop.num_envs + i) % len(skills)] for i in range(batch)]
        proposals, _ = designer.regenerate(
            slots, stream=sampler.stream(
                rnd, "pool", dict(temperature=dargs.designer_temperature, top_p=loop.top_p,
                                  top_k=loop.top_k),
                render=sampler.chats(dargs.designer_thinking),
                max_new_tokens=dargs.designer_max_tokens),
            validate=lambda src: sb.validate(src, setting=loop.setting), corpus=corpus,
            memory_block=None, setting=loop.setting,
            rng=random.Random(sampling.derive_seed("pool", seed, rnd)),
            max_attempts=dargs.max_attempts, max_turns=loop.max_turns)
        for p in (p for p in proposals if p.ok):
            name = f"env_{len(manifest):05d}.py"
            rundir.atomic_write(out / name, p.source)
            manifest[name] = {"skill": p.skill, "setting": loop.setting,
                              "class_name": p.class_name}
            bar.update(1)
        rnd, dry = rnd + 1, 0 if any(p.ok for p in proposals) else dry + 1
        rundir.atomic_write(manifest_path, json.dumps(manifest, indent=1, sort_keys=True))
        rundir.atomic_write(state_path, json.dumps(
            {"round": rnd, "corpus": corpus.state_dict() if corpus is not None else None}))
    bar.close()
    return out


def fixed_env_schedule(n: int, k: int, steps: int, seed: int = 42) -> list[list[int]]:
    """The Fixed-env GRPO draw (the authors' static pool without replacement, seed 42): the
    pool's indices shuffled once, k taken per step; when fewer than k remain, the rest are taken
    and the step is filled from a fresh shuffle without repeating them, which then continues."""
    rng, k = random.Random(seed), min(k, n)
    remaining = list(range(n))
    rng.shuffle(remaining)
    out = []
    for _ in range(steps):
        chosen, remaining = remaining[:k], remaining[k:]
        if len(chosen) < k:
            refill = list(range(n))
            rng.shuffle(refill)
            refill = [i for i in refill if i not in set(chosen)]
            chosen, remaining = chosen + refill[:k - len(chosen)], refill[k - len(chosen):]
        out.append(chosen)
    return out


def fixed_draws(pools: config.PoolArgs, loop: config.LoopArgs, sb, rank: int,
                world: int) -> list[list[dict]]:
    """The Fixed-env GRPO baseline (--fixed_envs): each step's environments (this rank's share of
    the step's draw from the validated static pool, as train.PoolEnv fields); [] in a SPADE run."""
    if not pools.fixed_envs:
        return []
    fixed = load(pools.fixed_envs, loop.setting, sb, "fixed")
    if not fixed:
        raise SystemExit(f"--fixed_envs {pools.fixed_envs}: no environment passed validation")
    return [[fixed[i] for i in draw[rank::world]]
            for draw in fixed_env_schedule(len(fixed), loop.num_envs, loop.steps)]


class Schedule:
    """The loop's calendar, the one place train.py learns whether it runs SPADE or the baseline.
    SPADE: a regeneration every R steps, the pool carried between them, and the last designer
    epoch closed at the final step (train.py's deviation 3). The Fixed-env GRPO baseline
    (--fixed_envs): no designer, so no regeneration and no epoch to close; each step plays its
    draw from the static pool (`fixed_draws`), made into pool entries by `env` (train.PoolEnv)."""

    def __init__(self, pools: config.PoolArgs, loop: config.LoopArgs, sb, rank: int, world: int,
                 *, env=dict):
        self.steps, self.interval, self.env = loop.steps, loop.regen_interval, env
        self.designs = not pools.fixed_envs  # a designer writes the pool (SPADE), or none does
        self.draws = fixed_draws(pools, loop, sb, rank, world)

    def regenerates(self, step: int) -> bool:
        """Whether the designer regenerates the pool at `step` (Alg. 1 line 3)."""
        return step % self.interval == 0 and self.designs

    def closes_epoch(self, step: int) -> bool:
        """Whether `step` is the final step of a run with a designer: its last epoch's designer
        samples train now, and its statistics close (deviation 3)."""
        return step + 1 == self.steps and self.designs

    def pool(self, step: int, pool: list) -> list:
        """The pool `step` plays: SPADE's `pool` as it stands, or the baseline's draw."""
        return [self.env(**e) for e in self.draws[step]] if self.draws else pool


def load(specs: str, setting: str, sb, origin: str) -> list[dict]:
    """The environments of a comma-separated list of sources that pass validation, as the fields
    of train.PoolEnv. Bad ids or imports stop the run with a one-line message."""
    out = []
    for spec in split(specs):
        if imported.is_imported(spec):
            out += imported.load_ids(spec, setting, origin)
        else:
            out += load_dir(Path(spec), setting, sb, origin)
    unique = {}
    for e in out:                                                    # a source named twice: once
        unique.setdefault(e["env_id"], e)
    return list(unique.values())


def load_dir(path: Path, setting: str, sb, origin: str) -> list[dict]:
    """The environments (*.py) of one setting in a directory that pass validation; skills and
    settings from its `manifest.json` (file -> {skill, setting}), else a first docstring line
    `skill: <name>.`"""
    manifest = Path(path) / "manifest.json"
    meta = json.loads(manifest.read_text()) if manifest.exists() else {}
    envs = []
    for f in sorted(Path(path).glob("*.py")):
        info = meta.get(f.name, {})
        if info.get("setting", setting) != setting:
            continue
        src = f.read_text(encoding="utf-8")
        report = sb.validate(src, setting=setting)
        if not report.ok:
            continue
        first = src.lstrip().strip('"\' ').split("\n", 1)[0]
        skill = info.get("skill") or (first.split(":", 1)[1].split(".")[0].strip()
                                      if first.startswith("skill:") else "unknown")
        envs.append({"env_id": f"{origin}:{f.stem}", "skill": skill, "source": src,
                     "class_name": report.class_name, "origin": origin})
    return envs
