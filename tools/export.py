"""Export a SPADE run's curriculum: its designer-written environments as a GEM, Gymnasium or
OpenEnv package.

SPADE (arXiv 2608.19197) leaves, besides the policy, a curriculum: validated, seeded, multi-turn
environments with hints, win rates and hint-based regrets (Eq. 3). This file packages them for
other stacks:

    python -m tools.export RUN_DIR --format gem|gymnasium|openenv --out DIR [--min_regret X]
                           [--skills S ...]
    pip install DIR        # then: import gem, PACKAGE; env = gem.make("PACKAGE/<Class>-<env>-v0")
                           # openenv: python -m PACKAGE.openenv_env --port 8000, and any OpenEnv
                           # client (openenv_env.py: reset(seed, index), step({"message": ...}))

It reads what train.py wrote (through infra/rundir.py's readers): each regeneration's pool
(envs/step-S-rank-R/pool.json and sources), the designer attempts with their grounding documents
(designer/), and the logged plays (transcripts/). It takes every environment the designer wrote
that did not fault in training, filtered by --min_regret / --skills, and checks each again in the
sandbox here, with the run's limits: the validation probe (its verdict; a failing environment is
left out and listed), the first observation at seed 0, and a replay of every logged play
(reset(seed), then its actions). A replay that reproduces the logged observations and return goes
into replays.jsonl with every step's observation, reward and flags, so a user can check that the
package plays as training did.

DIR/pyproject.toml, DIR/manifest.json, and DIR/PACKAGE/: __init__.py (one registration per
environment; importing the package registers them all), proxy.py and gem_env.py, gymnasium_env.py
or openenv_env.py (from export_template/: the class gem.make / gymnasium.make return, or the
OpenEnv Environment openenv's create_app serves, which runs the code only inside a
sandbox.Sandbox), copies of sandbox.py and toolenv.py, envs/<env>.py (the sources), manifest.json
and replays.jsonl. The package needs only gem-llm, gymnasium or openenv (pinned: 0.10.0).

manifest.json: package (the import name), format, run, config_hash (sha256 of the run's
config.json), model, setting, sandbox_level (where the export validated), filters, and `envs`,
one per environment: id (registered), env_id (the run's), step, skill, class_name, source_file,
doc_id and doc_title (the grounding document; None without a corpus), hint, first_observation
(reset(seed=0)), seed_range (training draws 31-bit seeds), validation ("ok"), win_rate and plays
(its unhinted plays at its regeneration step, as memory.json counts them), regret, r_hint,
r_nohint, replays; `excluded` lists the environments left out and why.

What a run directory or a worker names stays data: config.json's model enters the package's
docstring as an escaped literal, an env id must be a plain file name and a class name (the
worker reports its runtime __name__) a plain identifier, else the environment is left out.

Test: `pytest tests/test_export.py tests/test_openenv_hostile.py -m ""` (-m "": the slow tier too;
the GEM / Gymnasium / OpenEnv calls run in a second virtualenv).
"""
from __future__ import annotations

import argparse
import functools
import hashlib
import json
import keyword
import re
import shutil
import sys
from pathlib import Path

import agent
import sandbox
import toolenv
from infra import metrics, rundir

TEMPLATE = Path(__file__).resolve().parent / "export_template"
SEED_RANGE = [0, 2**31 - 1]  # infra/sampling.py's derive_seed: play seeds are 31-bit
FORMATS = {"gem": ("gem_env", "SpadeGemEnv", "gem-llm>=0.1.0"),
           "gymnasium": ("gymnasium_env", "SpadeGymnasiumEnv", "gymnasium>=1.0"),
           "openenv": ("openenv_env", "SpadeEnvironment", "openenv==0.10.0")}


def candidates(run: dict) -> tuple[list[dict], list[dict]]:
    """(environments the designer wrote, once each, oldest first; those left out for a fault)."""
    seen, envs, out = set(), [], []
    for step in sorted(run["pools"]):
        for e in run["pools"][step]:
            if e.get("origin") != "designer" or e["env_id"] in seen:
                continue
            seen.add(e["env_id"])
            if e.get("faulty"):
                out.append({"env_id": e["env_id"], "reason": "faulted in training"})
            else:
                envs.append(e)
    return envs, out


def keep(e: dict, min_regret: float | None, skills: list[str] | None) -> str | None:
    """Why --min_regret / --skills leave `e` out, or None."""
    if skills and e.get("skill") not in skills:
        return f"skill {e.get('skill')!r} not in --skills"
    if min_regret is not None and (e.get("regret") is None or e["regret"] < min_regret):
        return f"regret {e.get('regret')} below --min_regret {min_regret}"
    return None


def logged_observations(t: dict, hint: str | None, setting: str) -> list[str] | None:
    """The observations a logged play saw, as agent.play wrote them into its messages: the reset's
    (inside the first user message) and one per later turn (tool outputs joined by newlines, as
    ToolEnv.step joins them; FORMAT_HINT taken off). None when the first message does not parse."""
    msgs = t.get("messages") or []
    head, tail = agent.first_user_message("\x00", hint if t.get("hinted") else None,
                                          setting).split("\x00")
    first = msgs[0]["content"] if msgs else ""
    if not (first.startswith(head) and first.endswith(tail)):
        return None
    out, turn = [first[len(head):len(first) - len(tail)]], None
    for m in msgs[1:] + [{"role": "assistant"}]:
        if m["role"] == "assistant":
            if turn:
                out.append("\n".join(turn).removesuffix(f"\n\n{agent.FORMAT_HINT}"))
            turn = []
        else:
            turn.append(m["content"])
    return out


def replay(sb, source: str, setting: str, seed: int, actions: list[str]) -> dict | None:
    """reset(seed), then the actions, in a fresh sandbox episode: every result (None: a fault)."""
    h = sb.open(source, setting)
    try:
        result = h.reset(seed)
        obs, steps = result[0], []
        for a in actions:
            if agent.fault(result) is not None:
                return None
            result = h.step(a)
            steps.append(list(result[:4]))
        return None if agent.fault(result) is not None else {
            "seed": seed, "actions": actions, "reset": obs, "steps": steps}
    finally:
        h.close()


def check_plays(sb, e: dict, plays: list[dict], setting: str) -> tuple[list[dict], int]:
    """(replays that reproduce their logged play, number that did not)."""
    good, bad = [], 0
    for t in plays:
        if t.get("status") == "env_error" or not isinstance(t.get("actions"), list):
            continue
        logged = logged_observations(t, e.get("hint"), setting)
        r = replay(sb, e["source"], setting, t["seed"], t["actions"])
        if r is None or logged is None:
            bad += 1
            continue
        seen = [r["reset"]] + [s[0] for s in r["steps"]]
        ended = bool(r["steps"]) and r["steps"][-1][2]
        ret = agent.episode_return([s[1] for s in r["steps"]], ended)
        if seen[:len(logged)] != logged or ret != t.get("return"):
            bad += 1
            continue
        good.append({**r, "hinted": bool(t.get("hinted")), "return": ret})
    return good, bad


NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,99}")    # a class name, as registration ids take it
ENV_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")  # the run's env ids (s0-r0-e0): a file name


class LeftOut(Exception):
    """Why an environment stays out of the package (listed in the manifest's `excluded`)."""


def entry(sb, run: dict, e: dict, package: str, setting: str) -> tuple[dict, list[dict]]:
    """The manifest entry of one environment and its replays; raises LeftOut. What the run
    directory and the worker name (env id, class name) become ids and a file name: checked."""
    if type(e["env_id"]) is not str or not ENV_ID.fullmatch(e["env_id"]):
        raise LeftOut(f"env id {str(e['env_id'])!r:.80} is not a plain name")
    if rundir.read_source(e, run["notes"]) is None:
        raise LeftOut("source file missing")
    verdict = sb.validate(e["source"], setting=setting)
    if not verdict.ok:
        raise LeftOut(f"validation: {verdict.error}")
    if not NAME.fullmatch(verdict.class_name):
        raise LeftOut(f"class name {verdict.class_name!r:.80} is not a plain identifier")
    h = sb.open(e["source"], setting)
    try:
        first = h.reset(0)
    finally:
        h.close()
    if (kind := agent.fault(first)) is not None:
        raise LeftOut(f"reset(seed=0): {kind}")
    first = first[0]
    plays = rundir.read_transcripts(run, e["step"], {e["env_id"]}).get(str(e["env_id"]), [])
    replays, bad = check_plays(sb, e, plays, setting)
    if bad:
        print(f"[export] {e['env_id']}: {bad} logged play(s) did not replay the same; left out of "
              "replays.jsonl", file=sys.stderr)
    rid, rets = f"{package}/{verdict.class_name}-{e['env_id']}-v0", list(e.get("returns") or [])
    attempt = rundir.attempt_of(run, e)
    item = {"id": rid, "env_id": e["env_id"], "step": e["step"], "skill": e.get("skill"),
            "class_name": verdict.class_name, "source_file": f"envs/{e['env_id']}.py",
            "doc_id": attempt.get("doc_id"), "doc_title": attempt.get("doc_title"),
            "hint": e.get("hint"), "first_observation": first, "seed_range": SEED_RANGE,
            "validation": "ok", "win_rate": metrics.win_rate(rets) if rets else None,
            "plays": len(rets), "regret": e.get("regret"), "r_hint": e.get("r_hint"),
            "r_nohint": e.get("r_nohint"), "replays": len(replays)}
    return item, [dict(r, id=rid) for r in replays]


def init_text(manifest: dict) -> str:
    """The package's __init__.py: one registration per environment."""
    fmt, pkg, n = manifest["format"], manifest["package"], len(manifest["envs"])
    module, cls, _ = FORMATS[fmt]
    q = functools.partial(json.dumps, ensure_ascii=False)      # ids and paths as "..." literals
    # config.json's model as an ASCII "..." literal: escaped, it cannot end the docstring
    head = (f'"""{n} environments that {json.dumps(str(manifest["model"]))} wrote while '
            f'training with SPADE (arXiv 2608.19197),\nexported from run {q(manifest["run"])} '
            f'(config {manifest["config_hash"][:19]}). ')
    if fmt == "openenv":  # nothing to register: a server serves them (openenv_env.py)
        return (head + f"Serve them all with `python -m {pkg}.{module} --port 8000`\n(OpenEnv's "
                "server; manifest.json lists them). Their code runs only in sandbox workers "
                '(proxy.py)."""\n')
    lines = [head + f'Importing this package registers each one\n'
             f'with {fmt}.make(id); manifest.json lists them. Their code runs only in sandbox '
             'workers (proxy.py)."""',
             "from gem.envs.registration import register" if fmt == "gem" else
             "from gymnasium import register", "", f'ENTRY = "{pkg}.{module}:{cls}"', ""]
    for e in manifest["envs"]:
        kw = (f'source_file={q(e["source_file"])}, setting={q(manifest["setting"])}, '
              f'name={q(e["id"])}')
        lines.append(f'register({q(e["id"])}, ENTRY,\n         {kw})' if fmt == "gem" else
                     f'register(id={q(e["id"])}, entry_point=ENTRY,\n         kwargs=dict({kw}))')
    return "\n".join(lines) + "\n"


def pyproject_text(manifest: dict) -> str:
    pkg, dep = manifest["package"], FORMATS[manifest["format"]][2]
    return ('[build-system]\nrequires = ["setuptools>=61"]\n'
            'build-backend = "setuptools.build_meta"\n\n'
            f'[project]\nname = "{pkg.replace("_", "-")}"\nversion = "0.1.0"\n'
            f'description = "SPADE-generated environments for {manifest["format"]}, sandboxed"\n'
            f'requires-python = ">=3.10"\ndependencies = ["{dep}"]\n\n'
            f'[tool.setuptools]\npackages = ["{pkg}"]\n\n'
            f'[tool.setuptools.package-data]\n'
            f'{pkg} = ["envs/*.py", "manifest.json", "replays.jsonl"]\n')


def write_package(out: Path, manifest: dict, sources: dict, replays: list) -> None:
    """Everything into OUT.tmp, then renamed to OUT: a killed export leaves no half package."""
    tmp, pkg = out.with_name(out.name + ".tmp"), manifest["package"]
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / pkg / "envs").mkdir(parents=True)
    text = json.dumps(manifest, indent=1, ensure_ascii=False) + "\n"
    files = {"pyproject.toml": pyproject_text(manifest), "manifest.json": text,
             f"{pkg}/manifest.json": text, f"{pkg}/__init__.py": init_text(manifest),
             f"{pkg}/replays.jsonl": "".join(json.dumps(r) + "\n" for r in replays),
             **{f"{pkg}/{e['source_file']}": sources[e["env_id"]] for e in manifest["envs"]}}
    for name, body in files.items():
        (tmp / name).write_text(body, encoding="utf-8")
    for src in (TEMPLATE / "proxy.py", TEMPLATE / f"{FORMATS[manifest['format']][0]}.py",
                Path(sandbox.__file__), Path(toolenv.__file__)):
        shutil.copyfile(src, tmp / pkg / src.name)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)


def export(run_dir: Path, fmt: str, out: Path, package: str, min_regret: float | None = None,
           skills: list[str] | None = None) -> dict:
    """Export RUN_DIR's curriculum into OUT as PACKAGE; returns the manifest."""
    try:
        run = rundir.load_run(run_dir)
    except rundir.NotARun as e:
        raise SystemExit(f"export: {e}") from None
    cfg = run["config"]
    if not cfg:
        raise SystemExit(f"export: {run_dir}/config.json is missing or unreadable")
    setting = cfg.get("setting", "games")
    envs, excluded = candidates(run)
    manifest = {"package": package, "format": fmt, "run": Path(run_dir).resolve().name,
                "config_hash": "sha256:" + hashlib.sha256(json.dumps(
                    cfg, sort_keys=True, separators=(",", ":")).encode()).hexdigest(),
                "model": cfg.get("model"), "setting": setting, "sandbox_level": None,
                "filters": {"min_regret": min_regret, "skills": skills}, "envs": [],
                "excluded": excluded}
    sources, replays = {}, []
    with sandbox.Sandbox(workers=2, step_timeout=cfg.get("step_timeout", 5.0),
                         memory_mb=cfg.get("sandbox_memory_mb", 1024)) as sb:
        manifest["sandbox_level"] = sb.level
        for e in envs:
            try:
                if (why := keep(e, min_regret, skills)) is not None:
                    raise LeftOut(why)
                item, plays = entry(sb, run, e, package, setting)
            except LeftOut as why:
                excluded.append({"env_id": e["env_id"], "reason": str(why)})
                continue
            manifest["envs"].append(item)
            sources[e["env_id"]] = e["source"]
            replays += plays
    write_package(out, manifest, sources, replays)
    return manifest


def main(argv=None) -> Path:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", type=Path, help="a train.py run directory")
    ap.add_argument("--format", required=True, choices=sorted(FORMATS))
    ap.add_argument("--out", required=True, type=Path, help="the package directory to write")
    ap.add_argument("--name", help="import name of the package (default: spade_<run dir name>)")
    ap.add_argument("--min_regret", type=float, help="keep environments with regret >= this")
    ap.add_argument("--skills", nargs="+", help="keep environments of these skills")
    ap.add_argument("--overwrite", action="store_true", help="replace --out if it holds files")
    a = ap.parse_args(argv)
    name = a.name or "spade_" + re.sub(r"\W+", "_", a.run_dir.resolve().name).strip("_").lower()
    if not name.isidentifier() or keyword.iskeyword(name):
        raise SystemExit(f"export: --name {name!r} is not a Python import name")
    if a.out.exists() and any(a.out.iterdir()) and not a.overwrite:
        raise SystemExit(f"export: {a.out} is not empty (pass --overwrite to replace it)")
    m = export(a.run_dir, a.format, a.out, name, a.min_regret, a.skills)
    print(f"[export] {len(m['envs'])} environments into {a.out} ({len(m['excluded'])} left out, "
          f"listed in manifest.json); sandbox level {m['sandbox_level']}. "
          f"Install: pip install {a.out}")
    return a.out


if __name__ == "__main__":
    main()
