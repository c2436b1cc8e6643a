"""Plays an exported SPADE package's OpenEnv server through verifiers' own OpenEnv taskset, as a
prime-rl user's environment does; prints a JSON report.

tests/test_export.py starts the server (the export virtualenv: openenv 0.10) and runs this file
with the verifiers virtualenv's Python (verifiers 0.4.0 with its openenv extra, nothing of this
repository) as `python -P verifiers_client.py URL PACKAGE_DIR`, from an empty directory. The
taskset is built from verifiers' config (`OpenEnvConfig`: base_url and one reset per logged play,
`{"seed", "index"}`), the environment by verifiers' loader, and each task is played by verifiers'
`OpenEnvEnv.run`: its /schema read, reset, its action parsing and its sum of step rewards into
the trace's `openenv_reward`. Only the player is scripted: in place of a model (whose harness
verifiers runs in a sandbox it installs over the network), it replies with the play's logged
actions, one per turn.
"""
import asyncio
import json
import sys
from pathlib import Path

import verifiers.v1 as vf
from verifiers.v1.utils.loaders import load_environment, resolve_env_config


class Segment:
    def __init__(self, reply: str):
        self.last_reply, self.terminated = reply, False


class Trace:
    def __init__(self):
        self.rewards, self.stopped = {}, None

    def record_reward(self, name: str, value: float) -> None:
        self.rewards[name] = value

    def stop(self, why: str) -> None:
        self.stopped = why


class Interaction:
    """The player's side of one task: each turn() is told the payload (observation and action
    schema, as OpenEnvEnv sends it) and answers the play's next logged action ("" once they are
    spent: OpenEnvEnv then ends the run)."""

    def __init__(self, actions: list, seen: list):
        self.actions, self.seen, self.trace = list(actions), seen, Trace()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        return False

    async def turn(self, payload: str) -> Segment:
        self.seen.append(json.loads(payload))
        return Segment(self.actions.pop(0) if self.actions else "")


class Player:
    """The player seat of one play: its interaction replies the play's logged actions."""

    def __init__(self, actions: list):
        self.actions, self.interactions, self.seen = actions, [], []

    def interaction(self, task):
        interaction = Interaction(self.actions, self.seen)
        self.interactions.append(interaction)
        return interaction


class Agents:
    def __init__(self, player: Player):
        self.player = player


async def play(url: str, manifest: dict, replays: list) -> list:
    """Every logged play as one task of the taskset (its reset: the play's seed and its
    environment's index), played by OpenEnvEnv.run with the play's actions."""
    index = {e["id"]: i for i, e in enumerate(manifest["envs"])}
    resets = [{"seed": r["seed"], "index": index[r["id"]]} for r in replays]
    env = load_environment(resolve_env_config(
        {"taskset": {"id": "openenv", "base_url": url, "resets": resets}}))
    out = []
    for replay, task in zip(replays, env.taskset, strict=True):  # tasks in the resets' order
        player = Player(replay["actions"])
        await env.run(task, Agents(player))
        [done] = player.interactions
        out.append({"id": replay["id"], "seed": task.data.reset["seed"], "task": task.data.name,
                    "verifiers_return": done.trace.rewards.get("openenv_reward"),
                    "return": replay["return"],
                    "env_reward_sum": sum(s[1] for s in replay["steps"]),
                    "first_observation": player.seen[0]["observation"]["text"],
                    "schema": sorted(player.seen[0]["action_schema"].get("required", [])),
                    "stopped": done.trace.stopped})
    return out


def main(url: str, package_dir: str) -> None:
    pkg = Path(package_dir)
    manifest = json.loads((pkg / "manifest.json").read_text(encoding="utf-8"))
    replays = [json.loads(x) for x in (pkg / "replays.jsonl").read_text().splitlines()]
    report = {"plays": asyncio.run(play(url, manifest, replays)), "verifiers": vf.__name__}
    report["modules"] = sorted(m for m in sys.modules if m.split(".")[0] in (
        "agent", "config", "train", "designer", "infra", "eval", "report", "sandbox", "proxy"))
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:3])
