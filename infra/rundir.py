"""The run directory: every file train.py leaves, written here, and the readers tools/report.py and
tools/export.py share (infrastructure, none of it the paper's). This docstring is its schema.

RUN_DIR (train.py --output_dir); S is a step, 4 digits (`tag`), R a rank, k a count of steps done:
    config.json                         the resolved configuration (config.config_dict), indented,
                                        keys sorted; --resume refuses a different one (but with
                                        --allow_config_change)
    metrics.jsonl                       one JSON row per step, keys sorted: the README's metric
                                        table, charts/step and sandbox/level (the main process
                                        writes it, reduced over the ranks); with --eval_every one
                                        more after the last step, its eval/* and time/eval_s
    envs/step-S-rank-R/pool.json        a regeneration's pool on rank R, indented: [{env_id, skill,
                                        origin, class_name, hint, regret, r_hint, r_nohint,
                                        returns, faulty}]
    envs/step-S-rank-R/<env_id>.py      each environment's source (":" of an env_id as "_")
    designer/step-S-rank-R.jsonl        a regeneration's designer attempts, one a line (Proposal's
                                        to_log: skill, slot, attempt, doc_id, ok, reason, error,
                                        source, ...)
    designer/scores-step-S-rank-R.json  the designer scores of the epoch that ended at step S:
                                        [{env_id, score}]
    transcripts/step-S-rank-R.jsonl     sample plays, one a line: {env_id, seed, hinted, return,
                                        status, error, actions, rendered_prompt, messages}; at a
                                        regeneration up to --transcripts per new environment
                                        (unhinted and hinted alternately), else the step's first
                                        --transcripts
    memory.json                         the environment memory (memory.py writes it every step;
                                        --memory_from reads it)
    checkpoint-<k>/                     every --checkpoint_every steps and at the end, the newest
                                        --keep_checkpoints kept: Accelerate's state plus
                                        spade_state-<R>.json (rank R's loop state,
                                        train.State.to_dict: world, and metrics_lines, the
                                        metrics.jsonl rows it has seen)
    latest                              the newest checkpoint's name (what --resume continues)
    final_model/                        the policy in Hugging Face format, in its shipped dtype;
                                        a LoRA run (--lora_rank): its adapter in PEFT's format
                                        (adapter_config.json, adapter_model.safetensors) and,
                                        with --lora_merge, merged/, the merged model
    adapter-sync/rank-R/                a LoRA run on vLLM: the adapter each weight sync hands
                                        it (the newest only; removed at the end)
    exports/step-<k>/                   the same every --export_every steps and at the end, the
                                        newest --keep_checkpoints kept (eval.py --checkpoints)
    eval/step-<k>/                      --eval_every: the held-out suites on the weights after k
                                        updates (infra/evaluation.py), eval.py's files:
                                        results.json, samples/<suite>.jsonl (every item's reply
                                        and score), table1.md; their metrics are metrics.jsonl's
                                        eval/* (the evaluation after the last step: a row of its
                                        own, charts/step = steps)
    eval/checkpoints.{md,csv,json}      eval.py's sweep summary over those evaluations, naming
                                        the best step (eval.write_sweep)
    spade/, wandb/                      --log_with tensorboard's event files; W&B's run files
                                        (offline: WANDB_MODE=offline)
Every file is written beside its place and renamed into it (a directory as `<name>.tmp`), so a
killed run never leaves a torn one; metrics.jsonl grows a line a step, and a resume cuts it back
to its checkpoint's rows. The run never renders its HTML page: `python -m tools.report RUN_DIR`
does, from these files, during the run or after it.

The readers (load_run) take any of these files missing, a partial last line (a run still
writing) or fields of unexpected types, and note what they could not read; a directory that holds
none of the run's files is NotARun. A transcript line is parsed (json.loads) only when it holds a
wanted env_id as a JSON string, and kept by its env_id field: a long run's plays are hundreds of
times larger than what a page shows.
Dependencies: the standard library. Test: `pytest tests/test_rundir.py` (the writers in a run:
tests/test_train_e2e.py; the readers on a run: tests/test_report.py, tests/test_export.py).
"""
from __future__ import annotations

import json
import os
import re
import shutil
from itertools import zip_longest
from pathlib import Path

# the step-S-rank-R name of a step's files and folders, as `tag` writes it
TAG = re.compile(r"(?:scores-)?step-(\d+)-rank-(\d+)\.(?:jsonl|json)$|^step-(\d+)-rank-(\d+)$")


def tag(step: int, rank: int) -> str:
    return f"step-{step:04d}-rank-{rank}"


def env_file(env_id) -> str:
    """The file name of an environment's source in its envs/ folder."""
    return f"{str(env_id).replace(':', '_')}.py"


# ----------------------------------------------------------------------------------------------
# Writing: the run's own files, each atomically.

def atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def prepare_run_dir(run_dir: Path, cfg: dict, rargs, accelerator) -> Path | None:
    """Return the checkpoint to resume from (or None); refuse a foreign or clobbered run dir."""
    saved = run_dir / "config.json"
    if rargs.resume:
        if not (run_dir / "latest").exists():
            raise SystemExit(f"--resume: no checkpoint in {run_dir}")
        old = json.loads(saved.read_text())
        diff = sorted(k for k in set(old) | set(cfg) if old.get(k) != cfg.get(k))
        if diff and not rargs.allow_config_change:
            raise SystemExit(f"--resume: {run_dir} was run with a different config "
                             f"({', '.join(diff)}); pass --allow_config_change to continue anyway")
        return run_dir / (run_dir / "latest").read_text().strip()
    exists = saved.exists()
    accelerator.wait_for_everyone()  # every rank looked before the main one writes
    if exists and not rargs.overwrite:
        raise SystemExit(f"{run_dir} already holds a run: pass --resume to continue it or "
                         "--overwrite")
    if accelerator.is_main_process:
        if run_dir.exists() and rargs.overwrite:
            shutil.rmtree(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        atomic_write(saved, json.dumps(cfg, indent=2, sort_keys=True))
    accelerator.wait_for_everyone()
    return None


def append_metrics(run_dir: Path, row: dict) -> None:
    """One step's row at the end of metrics.jsonl (the main process only)."""
    with open(run_dir / "metrics.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps(row, sort_keys=True) + "\n")


def metrics_lines(run_dir: Path) -> int:
    """The rows metrics.jsonl holds now (a checkpoint records them: cut_metrics)."""
    return len((run_dir / "metrics.jsonl").read_text().splitlines())


def cut_metrics(run_dir: Path, lines: int) -> None:
    """metrics.jsonl back to its first `lines` rows: the steps a resume replays log again."""
    path = run_dir / "metrics.jsonl"
    kept = path.read_text().splitlines()[:lines]
    atomic_write(path, "".join(line + "\n" for line in kept))


def write_step_files(run_dir: Path, step: int, new_pool, episodes, n_transcripts: int,
                     proposals: list[dict], rank: int, scored=()) -> None:
    """Per rank: the freshly designed environments with their hints and first returns, every
    designer attempt with its rejection reason and message, the designer scores of the finished
    epoch (`scored`: train.Design records, read for env.env_id and score), and sample
    transcripts: at a regeneration up to `n_transcripts` per new environment (unhinted and hinted
    alternately, for tools/report.py's cards), else the step's first few."""
    name = tag(step, rank)
    chosen = episodes[:n_transcripts]
    if new_pool:
        d = run_dir / "envs" / name
        d.mkdir(parents=True, exist_ok=True)
        for e in new_pool:
            atomic_write(d / env_file(e.env_id), e.source)
        atomic_write(d / "pool.json", json.dumps(
            [{"env_id": e.env_id, "skill": e.skill, "origin": e.origin, "class_name": e.class_name,
              "hint": e.hint, "regret": e.regret, "r_hint": e.r_hint, "r_nohint": e.r_nohint,
              "returns": e.returns, "faulty": e.faulty} for e in new_pool], indent=2))
        arms = [[[ep for ep in episodes if ep.env_id == e.env_id and ep.hinted == h]
                 for h in (False, True)] for e in new_pool]
        chosen = [ep for plain, hinted in arms for ep in
                  [x for pair in zip_longest(plain, hinted) for x in pair if x][:n_transcripts]]
    for sub, rows in (("designer", proposals), ("transcripts", [
            {"env_id": ep.env_id, "seed": ep.seed, "hinted": ep.hinted, "return": ep.ret,
             "status": ep.status, "error": ep.error, "actions": ep.actions,
             "rendered_prompt": ep.rendered_prompt, "messages": ep.messages}
            for ep in chosen])):
        if rows:
            (run_dir / sub).mkdir(exist_ok=True)
            text = "".join(json.dumps(r) + "\n" for r in rows)
            atomic_write(run_dir / sub / f"{name}.jsonl", text)
    if scored:
        (run_dir / "designer").mkdir(exist_ok=True)
        atomic_write(run_dir / "designer" / f"scores-{name}.json",
                     json.dumps([{"env_id": d.env.env_id, "score": d.score} for d in scored]))


def prune(paths, keep: str) -> None:
    """Delete all but the newest `keep` (a number, or all) of these directories, oldest first."""
    if keep != "all":
        for old in sorted(paths, key=lambda p: p.stat().st_mtime)[:max(len(paths) - int(keep), 0)]:
            shutil.rmtree(old, ignore_errors=True)


def save_checkpoint(accelerator, run_dir: Path, step: int, state: dict, keep: str = "2") -> None:
    """Write checkpoint-<step> atomically: save into a temp dir, then rename and
    repoint `latest`."""
    tmp, final = run_dir / f"checkpoint-{step}.tmp", run_dir / f"checkpoint-{step}"
    if accelerator.is_main_process and tmp.exists():
        shutil.rmtree(tmp)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp))
    tmp.mkdir(parents=True, exist_ok=True)
    atomic_write(tmp / f"spade_state-{accelerator.process_index}.json", json.dumps(state))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        atomic_write(run_dir / "latest", final.name)
        older = [p for p in run_dir.glob("checkpoint-*")
                 if p.name != final.name and not p.name.endswith(".tmp")]
        prune(older, "all" if keep == "all" else str(int(keep) - 1))
    accelerator.wait_for_everyone()


def load_state(checkpoint: Path, rank: int) -> dict:
    """Rank `rank`'s loop state saved in `checkpoint` (save_checkpoint's `state`)."""
    return json.loads((checkpoint / f"spade_state-{rank}.json").read_text())


def export_policy(accelerator, model, tokenizer, dest: Path, dtype) -> None:
    """The policy in Hugging Face format at `dest` (written beside it, then renamed into place),
    in `dtype`: the one the model shipped in (bf16 for the paper's), not the fp32 masters."""
    state_dict = accelerator.get_state_dict(model)  # every rank takes part (sharded models)
    if accelerator.is_main_process:
        tmp = dest.with_name(dest.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        accelerator.unwrap_model(model).save_pretrained(
            tmp, state_dict={k: v.to(dtype) for k, v in state_dict.items()})
        config = json.loads((tmp / "config.json").read_text())  # it names the live fp32 dtype
        atomic_write(tmp / "config.json", json.dumps({**config, "dtype": str(dtype)[6:]}, indent=2))
        tokenizer.save_pretrained(tmp)
        shutil.rmtree(dest, ignore_errors=True)
        os.replace(tmp, dest)
    accelerator.wait_for_everyone()


def save_export(accelerator, model, tokenizer, run_dir: Path, step: int, dtype,
                keep: str, export=None) -> None:
    """exports/step-<step> (`export`, export_policy's arguments; default export_policy), then
    only the newest `keep` exports (prune)."""
    exports = run_dir / "exports"
    exports.mkdir(exist_ok=True)
    (export or export_policy)(accelerator, model, tokenizer, exports / f"step-{step}", dtype)
    if accelerator.is_main_process:
        prune([p for p in exports.glob("step-*") if not p.name.endswith(".tmp")], keep)


# ----------------------------------------------------------------------------------------------
# Reading: every reader tolerates missing and partial files and notes them.

class NotARun(ValueError):
    """The directory is not a SPADE run directory (nothing train.py writes is there)."""


def read_json(path: Path, notes: list, default=None):
    try:
        return json.loads(path.read_text(encoding="utf-8", errors="replace"))
    except FileNotFoundError:
        notes.append(f"{path.name} is missing")
    except (OSError, ValueError) as e:
        notes.append(f"{path.name} could not be read ({type(e).__name__})")
    return default


def read_jsonl(path: Path, notes: list) -> list[dict]:
    """The JSON-object lines of a file; unreadable lines (a run still writing leaves a partial last
    line) are skipped and counted in the notes."""
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError as e:
        notes.append(f"{_shown(path)} could not be read ({type(e).__name__})")
        return []
    return _objects(lines, notes, _shown(path))


def _shown(path: Path) -> str:
    """How a note names a file: designer/ and transcripts/ files with their folder."""
    folder = path.parent.name
    return f"{folder}/{path.name}" if folder in ("designer", "transcripts") else path.name


def _objects(lines: list[str], notes: list, name: str) -> list[dict]:
    rows, bad = [], 0
    for line in lines:
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            row = None
        if isinstance(row, dict):
            rows.append(row)
        else:
            bad += 1
    if bad:
        notes.append(f"{name}: {bad} unreadable line(s) skipped "
                     "(a run still writing leaves a partial last line)")
    return rows


def tagged(folder: Path, pattern: str) -> list[tuple[int, int, Path]]:
    """(step, rank, path) of the step-S-rank-R files or folders in `folder`, sorted."""
    out = []
    for p in folder.glob(pattern) if folder.is_dir() else []:
        m = TAG.search(p.name)
        if m:
            g = [x for x in m.groups() if x is not None]
            out.append((int(g[0]), int(g[1]), p))
    return sorted(out)


def load_pools(run_dir: Path, notes: list) -> dict[int, list[dict]]:
    """{regeneration step: its pool over all ranks}, each environment with its step, rank and
    source file (read by read_source)."""
    pools: dict[int, list[dict]] = {}
    for step, rank, d in tagged(run_dir / "envs", "step-*-rank-*"):
        entries = read_json(d / "pool.json", notes, [])
        if not isinstance(entries, list):
            notes.append(f"envs/{d.name}/pool.json is not a list")
            continue
        for e in entries:
            if isinstance(e, dict) and "env_id" in e:
                f = d / env_file(e["env_id"])
                pools.setdefault(step, []).append({**e, "step": step, "rank": rank, "file": f})
    return pools


def read_source(env: dict, notes: list) -> str | None:
    """An environment's code, read only for the environments shown (a long run holds thousands)."""
    if "source" not in env:
        try:
            env["source"] = env["file"].read_text(encoding="utf-8", errors="replace")
        except OSError:
            env["source"] = None
            notes.append(f"envs/{env['file'].parent.name}/{env['file'].name} is missing")
    return env["source"]


def read_transcripts(run: dict, step: int, wanted: set) -> dict[str, list[dict]]:
    """The logged plays at one step of the environments in `wanted`, by env_id. A line is parsed
    only when it holds a wanted id as json.dumps writes it (anywhere: the test is cheap, the parse
    is not), and kept when its env_id field is one; unreadable lines among those are noted."""
    quoted = [json.dumps(str(w)) for w in wanted]
    out: dict[str, list[dict]] = {}
    for p in run["transcript_files"].get(step, []):
        try:
            with open(p, encoding="utf-8", errors="replace") as f:
                lines = [line for line in f if any(q in line for q in quoted)]
        except OSError as e:
            run["notes"].append(f"{_shown(p)} could not be read ({type(e).__name__})")
            continue
        for t in _objects(lines, run["notes"], _shown(p)):
            if str(t.get("env_id")) in wanted:
                out.setdefault(str(t.get("env_id")), []).append(dict(t, step=step))
    return out


def attempt_of(run: dict, env: dict) -> dict:
    """The designer attempt that became this environment (same step, rank and source)."""
    for a in run["attempts"].get(env["step"], []):
        same_env = a.get("rank") == env.get("rank") and a.get("source") == env.get("source")
        if a.get("ok") and same_env:
            return a
    return {}


def load_run(run_dir: Path) -> dict:
    """Everything a run directory holds but the sources and the transcripts (read on demand:
    read_source, read_transcripts), read once: {"dir", "notes" (what could not be read), "config",
    "rows" (metrics.jsonl), "pools" (load_pools), "attempts" ({step: attempts, each with its
    rank}), "scores" ({env_id: designer score}), "transcript_files" ({step: paths}), "memory" (its
    records)}. Raises NotARun for a directory that is not a run."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise NotARun(f"{run_dir} is not a directory")
    marks = ("config.json", "metrics.jsonl", "envs", "designer", "transcripts")
    if not any((run_dir / m).exists() for m in marks):
        raise NotARun(f"{run_dir} is not a SPADE run directory: it holds none of "
                      f"{', '.join(marks)} (train.py --output_dir writes them)")
    notes: list[str] = []
    run = {"dir": run_dir, "notes": notes, "config": read_json(run_dir / "config.json", notes, {})}
    if not isinstance(run["config"], dict):
        run["config"] = {}
    metrics_path = run_dir / "metrics.jsonl"
    run["rows"] = read_jsonl(metrics_path, notes) if metrics_path.exists() else []
    if not metrics_path.exists():
        notes.append("metrics.jsonl is missing: no curves")
    run["pools"] = load_pools(run_dir, notes)
    run["attempts"] = {}
    for step, rank, p in tagged(run_dir / "designer", "step-*-rank-*.jsonl"):
        attempts = (dict(a, rank=rank) for a in read_jsonl(p, notes))
        run["attempts"].setdefault(step, []).extend(attempts)
    run["scores"] = {}
    for _, _, p in tagged(run_dir / "designer", "scores-step-*-rank-*.json"):
        for s in read_json(p, notes, []) or []:
            if isinstance(s, dict) and "env_id" in s:
                run["scores"][str(s["env_id"])] = s.get("score")
    run["transcript_files"] = {}
    for step, _, p in tagged(run_dir / "transcripts", "step-*-rank-*.jsonl"):
        run["transcript_files"].setdefault(step, []).append(p)
    mem = {}
    if (run_dir / "memory.json").exists() or not run["config"].get("no_memory"):
        mem = read_json(run_dir / "memory.json", notes, {})
    run["memory"] = [r for r in (mem.get("records") if isinstance(mem, dict) else None) or []
                     if isinstance(r, dict)]
    return run
