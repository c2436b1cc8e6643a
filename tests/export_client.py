"""Plays an exported SPADE package as a user of GEM or Gymnasium would; prints a JSON report.

tests/test_export.py runs it with the export virtualenv's Python (gem-llm and gymnasium, nothing
of this repository), as `python -P export_client.py FORMAT PACKAGE HOSTILE_CLASS` from an empty
directory, so no file of ours can shadow a package. It makes every environment with gem.make /
gymnasium.make, checks the first observation at seed 0, replays every logged play of
replays.jsonl and compares each step's result exactly, then attacks the hostile environment
(`\\boxed{attack}` reports what it could read and write, `\\boxed{hang}` never returns) with
step_timeout=1.0, and lists the child processes left after every environment is closed; it
exits with one environment still open (tests/test_export.py looks for what outlives it).
"""
import importlib
import json
import os
import sys
import time
from importlib.resources import files


def children() -> list[int]:
    out = []
    for tid in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{tid}/children") as f:
            out += [int(p) for p in f.read().split()]
    return out


def replay_all(lib, manifest: dict, replays: list) -> dict:
    out = {"made": [], "first_observation_ok": [], "replayed": 0, "mismatches": []}
    for e in manifest["envs"]:
        env = lib.make(e["id"])
        out["made"].append([e["id"], type(env.unwrapped).__name__, env.unwrapped.sandbox_level])
        out["first_observation_ok"].append(env.reset(seed=0)[0] == e["first_observation"])
        for r in (r for r in replays if r["id"] == e["id"]):
            obs, _ = env.reset(seed=r["seed"])
            steps = [list(env.step(a)[:4]) for a in r["actions"]]
            out["replayed"] += 1
            if obs != r["reset"] or steps != r["steps"]:
                out["mismatches"].append({"id": e["id"], "seed": r["seed"], "reset": obs,
                                          "steps": steps})
        env.close()
    return out


def attack(lib, manifest: dict, hostile_class: str) -> dict:
    e = next(x for x in manifest["envs"] if x["class_name"] == hostile_class)
    env = lib.make(e["id"], step_timeout=1.0)
    env.reset(seed=1)
    out = {"attack": env.step(r"\boxed{attack}")[0]}
    start = time.monotonic()
    try:
        env.step(r"\boxed{hang}")
        out["fault"] = None
    except Exception as err:  # noqa: BLE001 - the report says what was raised
        out["fault"] = [type(err).__name__, getattr(err, "kind", None), str(err)]
    out["hang_seconds"] = time.monotonic() - start
    out["after_fault"] = env.reset(seed=1)[0]          # a fresh episode after the fault
    out["children_open"] = len(children())
    env.close()
    return out


def main(fmt: str, package: str, hostile_class: str) -> None:
    lib = importlib.import_module(fmt)
    importlib.import_module(package)                     # registers every environment
    manifest = json.loads((files(package) / "manifest.json").read_text(encoding="utf-8"))
    lines = (files(package) / "replays.jsonl").read_text(encoding="utf-8").splitlines()
    report = replay_all(lib, manifest, [json.loads(line) for line in lines])
    report.update(attack(lib, manifest, hostile_class))
    report["children_after_close"] = children()
    report["modules"] = sorted(m for m in sys.modules if m.split(".")[0] in (
        "agent", "config", "train", "designer", "infra", "eval", "report"))
    print(json.dumps(report), flush=True)
    lib.make(manifest["envs"][0]["id"]).reset(seed=0)    # left open: the exit must close it


if __name__ == "__main__":
    main(*sys.argv[1:4])
