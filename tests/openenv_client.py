"""Plays an exported SPADE package's OpenEnv server as an OpenEnv user would; prints a JSON report.

tests/test_export.py starts the server (`python -m PACKAGE.openenv_env --port P --step_timeout 2`)
and runs this file with the export virtualenv's Python (openenv 0.10, nothing of this repository)
as `python -P openenv_client.py URL PACKAGE_DIR HOSTILE_CLASS`, from an empty directory. Through
openenv's own GenericEnvClient it replays every logged play of replays.jsonl and compares each
step exactly (the environment's own reward is the observation's env_reward; OpenEnv's reward is
0.0 until the last step, which carries the play's return), reads the task API back against the manifest, attacks the hostile environment
(`\\boxed{attack}` reports what it could read and write, `\\boxed{hang}` never returns), sends
malformed actions (a number, two megabytes, a lone surrogate, and over a raw WebSocket a text
frame that is not UTF-8), and plays two sessions at once, interleaved.
"""
import json
import sys
import time
import urllib.request
from pathlib import Path

from openenv.core import GenericEnvClient


def played(client, index: int, seed: int, actions: list, rewards=None) -> list:
    """[first observation, then [text, env_reward, terminated, truncated] per step]; OpenEnv's
    rewards appended to `rewards`."""
    r = client.reset(seed=seed, index=index)
    out = [r.observation["text"]]
    for a in actions:
        r = client.step({"message": a})
        o = r.observation
        out.append([o["text"], o["env_reward"], o["terminated"], o["truncated"]])
        (rewards if rewards is not None else []).append(r.reward)
    return out


def replay_all(url: str, manifest: dict, replays: list) -> dict:
    out = {"first_observation_ok": [], "replayed": 0, "mismatches": [], "rewards": []}
    with GenericEnvClient(base_url=url).sync() as client:
        for i, e in enumerate(manifest["envs"]):
            first = client.reset(seed=0, index=i).observation
            out["first_observation_ok"].append(first["text"] == e["first_observation"]
                                               and first["env_id"] == e["id"])
            for r in (r for r in replays if r["id"] == e["id"]):
                rewards = []
                got = played(client, i, r["seed"], r["actions"], rewards)
                out["rewards"].append([rewards, r["return"]])
                out["replayed"] += 1
                if got != [r["reset"]] + r["steps"]:
                    out["mismatches"].append({"id": e["id"], "seed": r["seed"], "got": got})
    return out


def tasks(url: str, package: str) -> list:
    req = urllib.request.Request(f"{url}/{package}/tasks", data=b'{"split": "curriculum"}',
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as f:
        return json.loads(f.read())["tasks"]


def attack(url: str, manifest: dict, hostile_class: str) -> dict:
    index = next(i for i, e in enumerate(manifest["envs"]) if e["class_name"] == hostile_class)
    with GenericEnvClient(base_url=url).sync() as client:
        client.reset(seed=1, index=index)
        out = {"attack": client.step({"message": r"\boxed{attack}"}).observation["text"]}
        start = time.monotonic()
        r = client.step({"message": r"\boxed{hang}"})
        out["hang_seconds"] = time.monotonic() - start
        out["fault"] = [r.observation["error"], r.done, r.reward]
        out["after_fault"] = client.reset(seed=1, index=index).observation["text"]
    return out


def malformed(url: str) -> dict:
    out = {}
    with GenericEnvClient(base_url=url).sync() as client:
        client.reset(seed=3, index=0)
        for name, message in (("number", 42), ("megabytes", "x" * (2 << 20)),
                              ("surrogate", "\ud800")):
            try:
                client.step({"message": message})
                out[name] = None
            except RuntimeError as e:
                out[name] = str(e)[:300]
        out["then"] = client.step({"message": r"\boxed{heads}"}).observation["text"]
    from websockets.sync.client import connect
    with connect(url.replace("http", "ws") + "/ws") as ws:
        ws.send(json.dumps({"type": "reset", "data": {"seed": 3}}))
        ws.recv(timeout=30)
        ws.send(b'{"type": "step", "data": {"message": "\xff\xfe"}}', text=True)
        try:
            out["invalid_utf8"] = ["answered", ws.recv(timeout=30)[:200]]
        except Exception as e:  # noqa: BLE001 - the report says how the server refused it
            out["invalid_utf8"] = [type(e).__name__, getattr(getattr(e, "rcvd", None), "code", None)]
    return out


def two_at_once(url: str, manifest: dict, replays: list) -> dict:
    """Two sessions of the first environment, stepped in turn, one replaying a logged play and
    one the same actions at the next seed (played alone first): each must play as alone."""
    a = next(r for r in replays if r["id"] == manifest["envs"][0]["id"])
    with GenericEnvClient(base_url=url).sync() as solo:
        alone = played(solo, 0, a["seed"] + 1, a["actions"])
    b = {"seed": a["seed"] + 1, "actions": a["actions"], "reset": alone[0], "steps": alone[1:]}
    with GenericEnvClient(base_url=url).sync() as ca, GenericEnvClient(base_url=url).sync() as cb:
        got = {"a": [ca.reset(seed=a["seed"], index=0).observation["text"]],
               "b": [cb.reset(seed=b["seed"], index=0).observation["text"]]}
        for i in range(max(len(a["actions"]), len(b["actions"]))):
            for key, client, r in (("a", ca, a), ("b", cb, b)):
                if i < len(r["actions"]):
                    x = client.step({"message": r["actions"][i]})
                    got[key].append([x.observation["text"], x.observation["env_reward"],
                                     x.observation["terminated"], x.observation["truncated"]])
    return {"a_same": got["a"] == [a["reset"]] + a["steps"],
            "b_same": got["b"] == alone, "differ": alone != [a["reset"]] + a["steps"]}


def main(url: str, package_dir: str, hostile_class: str) -> None:
    pkg = Path(package_dir)
    manifest = json.loads((pkg / "manifest.json").read_text(encoding="utf-8"))
    replays = [json.loads(x) for x in (pkg / "replays.jsonl").read_text().splitlines()]
    report = replay_all(url, manifest, replays)
    report["tasks_same"] = tasks(url, manifest["package"]) == manifest["envs"]
    report.update(attack(url, manifest, hostile_class))
    report["malformed"] = malformed(url)
    report["two"] = two_at_once(url, manifest, replays)
    report["after_all"] = replay_all(url, manifest, replays[:1])["mismatches"]
    report["modules"] = sorted(m for m in sys.modules if m.split(".")[0] in (
        "agent", "config", "train", "designer", "infra", "eval", "report", "sandbox", "proxy"))
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:4])
