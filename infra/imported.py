"""Environments from outside this run, for the pools of infra/baseline.py: GEM and Gymnasium ids,
played in this process, OpenEnv servers on this machine; and another run's memory (--memory_from).

A pool source (`--fixed_envs`, `--fallback_envs`) may name, besides a directory of *.py files:

    gem:ID           a GEM environment, e.g. gem:rg:basic_arithmetic (Reasoning-Gym through GEM's
                     wrapper) or gem:game:GuessTheNumber-v0-easy; an id `PKG/...` imports PKG
                     first (the ids of a tools/export.py package)
    gymnasium:ID     a Gymnasium environment with text observations and actions; gymnasium's own
                     `module:Name-v0` form imports the module first
    openenv:URL      an OpenEnv server on this machine (http://127.0.0.1:PORT), e.g. a
                     tools/export.py --format openenv package's; `#k=v&...` after the URL are
                     its reset() arguments (`#index=2`: the package's third environment)
    ID patterns      gem:rg:* and the like (fnmatch) take every registered id that matches

A GEM or Gymnasium environment is trusted library code, not model-written: it is played in this
process by `InProcessEnv`, which has EnvHandle's surface (reset, step, tools, close), so agent.play
and the pool's statistics treat it as any other environment. Its semantics follow the sandbox's: a
fresh instance per episode (an episode depends only on its seed), the global `random` /
`numpy.random` states it sees are its own, seeded from the episode's seed and set aside between
calls (GEM's reset seeds them), and an exception or a malformed result (the sandbox's own checks:
sandbox.check_reset, sandbox.check_step) is an environment fault with a named kind. Unlike the
sandbox there is no deadline: a hanging library call hangs the run.

An OpenEnv server is a peer, not a library: openenv.py's `RemoteEnv` plays it, with the same
surface. train.play_pool plays a pool with imported entries through `batched` (OpenEnv handles in
threads, at once, beside the sandbox's batches) and openenv.play_rounds.

`seed_memory` (--memory_from) fills a new run's environment memory with another run's records
(memory.json) or an export's manifest (tools/export.py): exemplars for the designer's prompts,
text only, never executed here.
Test: `pytest tests/test_export.py tests/test_openenv_hostile.py -m ""` (-m "": the slow tier too).
"""
from __future__ import annotations

import contextlib
import fnmatch
import importlib
import json
import random
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import memory as memory_lib
import sandbox
from infra import openenv

KINDS = ("gem:", "gymnasium:", "openenv:")


def is_imported(spec: str) -> bool:
    return spec.startswith(KINDS)


# making GEM / Gymnasium environments by id
def _registry(kind: str) -> dict:
    if kind == "gem":
        import gem  # noqa: F401 - registers GEM's own environments
        from gem.envs.registration import ENV_REGISTRY
        return ENV_REGISTRY
    import gymnasium
    return gymnasium.registry


def make(spec: str):
    """A new instance of `gem:ID` / `gymnasium:ID` / `openenv:URL`."""
    kind, env_id = spec.split(":", 1)
    if kind == "openenv":
        raise ValueError(f"{spec}: an OpenEnv server plays through RemoteEnv (imported.handle)")
    if kind == "gem":
        import gem
        if env_id not in _registry(kind) and "/" in env_id:
            importlib.import_module(env_id.split("/")[0])  # a package that registers its ids
        return gem.make(env_id)
    import gymnasium
    return gymnasium.make(env_id)


def expand(spec: str) -> list[str]:
    """The ids a spec names: itself, or every registered id matching its pattern."""
    kind, env_id = spec.split(":", 1)
    if kind == "openenv" or not any(c in env_id for c in "*?["):
        return [spec]
    return [f"{kind}:{i}" for i in sorted(fnmatch.filter(list(_registry(kind)), env_id))]


@contextlib.contextmanager
def _rngs(state: dict):
    """Run with the global random / numpy.random states in `state` (saved back on exit), then
    restore the caller's: an imported environment neither sees nor moves the trainer's."""
    np = sys.modules.get("numpy")
    outer = (random.getstate(), np.random.get_state() if np else None)
    random.setstate(state["random"])
    if np and state.get("numpy") is not None:
        np.random.set_state(state["numpy"])
    try:
        yield
    finally:
        state["random"], state["numpy"] = random.getstate(), np.random.get_state() if np else None
        random.setstate(outer[0])
        if np:
            np.random.set_state(outer[1])


class InProcessEnv:
    """An imported environment behind EnvHandle's surface; faults come back as EnvHandle's do:
    a sandbox.Fault result (an error observation), never a raise. Its own results are rebuilt as
    plain tuples and dicts, so nothing it returns can pass for a fault."""

    def __init__(self, spec: str):
        self.spec, self.env, self._state = spec, None, None

    def reset(self, seed: int | None = None) -> tuple[str, dict]:
        self.close()
        rng = random.Random(seed)                    # the episode's global RNG states: its seed
        np = sys.modules.get("numpy")
        self._state = {"random": rng.getstate(), "numpy": None if np is None else
                       np.random.RandomState(rng.getrandbits(32)).get_state()}
        try:
            with _rngs(self._state):
                self.env = make(self.spec)
                obs, info = self.env.reset(seed=seed)
            return sandbox.check_reset(_text(obs), _info(info))
        except Exception as e:  # noqa: BLE001 - library failures are environment faults
            return self._fault(e, "reset_error", step=False)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        if self.env is None:
            return sandbox.Fault.of("closed", "no episode is running", step=True)
        try:
            with _rngs(self._state):
                obs, reward, terminated, truncated, info = self.env.step(action)
            reward, terminated, truncated = map(_plain, (reward, terminated, truncated))
            return sandbox.check_step(_text(obs), reward, terminated, truncated, _info(info))
        except Exception as e:  # noqa: BLE001
            return self._fault(e, "step_error")

    def tools(self) -> list[dict]:
        return []

    def close(self) -> None:
        if self.env is not None:
            _close(self.env)
            self.env = None

    def _fault(self, e: Exception, kind: str, step: bool = True) -> sandbox.Fault:
        self.close()
        return sandbox.Fault.of_error(e, kind, step=step)


def _close(env) -> None:
    with contextlib.suppress(Exception):                             # GEM envs have no close()
        getattr(env, "close", lambda: None)()


# The values the sandbox's worker would have sent (numpy scalars as Python ones, a str subclass
# as its plain value), for the parent's checks: sandbox.check_reset / check_step.
def _text(obs) -> str:
    if not isinstance(obs, str):
        why = f"observation of type {type(obs).__name__}"
        raise sandbox.FaultError("invalid_observation", why)
    return str.__str__(obs)


def _plain(x):
    return x.item() if type(x).__module__ == "numpy" and hasattr(x, "item") else x


def _info(info) -> dict:
    return dict(info) if isinstance(info, dict) else {}


def load_ids(spec: str, setting: str, origin: str) -> list[dict]:
    """The environments an imported spec names that probe cleanly, as train.PoolEnv fields."""
    if setting != "games":
        raise SystemExit(f"{spec}: imported environments are text games (--setting games)")
    try:
        names = expand(spec)
    except ImportError as e:
        raise SystemExit(f"{spec}: {e} (pip install gem-llm / gymnasium)") from None
    if not names:
        raise SystemExit(f"{spec}: no registered id matches")
    return [env for env in map(probe, names, [origin] * len(names)) if env is not None]


def probe(spec: str, origin: str) -> dict | None:
    """An imported environment that makes, resets and takes the first probe action cleanly."""
    h = handle(spec)
    try:
        if isinstance(h, openenv.RemoteEnv) and not h.open():
            raise SystemExit(f"{spec}: cannot make it: {h.open_fault.message}")
        if isinstance(h, InProcessEnv):
            with _rngs({"random": random.Random(0).getstate()}):
                _close(make(spec))
    except openenv.Busy as e:
        raise SystemExit(f"{spec}: its server refused a session, every one in use: {e}") from None
    except Exception as e:  # noqa: BLE001 - an unknown id, a missing package: the user's to fix
        raise SystemExit(f"{spec}: cannot make it: {type(e).__name__}: {e}") from None
    result = h.reset(seed=0)
    name = type(getattr(h.env, "unwrapped", h.env)).__name__ if isinstance(
        h, InProcessEnv) else "OpenEnvRemote"
    if getattr(result, "fault", None) is None:
        result = h.step(sandbox.PROBE_ACTIONS[0])
    h.close()
    if (kind := getattr(result, "fault", None)) is not None:
        print(f"[spade] {spec} left out of the pool: {kind}: {result.message}", file=sys.stderr)
        return None
    return {"env_id": f"{origin}:{spec}".replace("/", "."), "skill": suite_skill(spec),
            "class_name": name,
            "source": f"# {spec}: an imported environment, played in-process\n", "origin": origin,
            "suite": spec}


def suite_skill(spec: str) -> str:
    """The skill an imported environment is counted under: its id's family (gem:rg:x -> rg,
    gem:game:y -> game, gymnasium:ns/Name-v0 -> ns), else gem / gymnasium."""
    kind, env_id = spec.split(":", 1)
    if kind == "openenv":
        return kind
    for sep in ("/", ":"):
        if sep in env_id:
            return env_id.split(sep)[0]
    return kind


# playing a pool that mixes sandbox handles, in-process environments and OpenEnv servers
def handle(spec: str):
    """The EnvHandle-like handle of an imported spec: RemoteEnv for openenv:, else InProcessEnv."""
    return openenv.RemoteEnv(spec) if spec.startswith("openenv:") else InProcessEnv(spec)


def batched(sb, step: bool):
    """step_many / reset_many for agent.play: sandbox handles in one batch, OpenEnv ones at once
    (a thread each: their time is the servers'), in-process ones in turn."""
    many = getattr(sb, "step_many" if step else "reset_many", None)   # None: one at a time

    def run(handles, args):
        call = (lambda h, a: h.step(a)) if step else (lambda h, a: h.reset(a))
        remote = [i for i, h in enumerate(handles) if isinstance(h, openenv.RemoteEnv)]
        direct = [i for i, h in enumerate(handles) if i not in remote and (
            many is None or isinstance(h, InProcessEnv))]
        rest = [i for i in range(len(handles)) if i not in remote and i not in direct]
        out = [None] * len(handles)
        with ThreadPoolExecutor(max(1, len(remote))) as pool:
            futures = {i: pool.submit(call, handles[i], args[i]) for i in remote}
            for i in direct:
                out[i] = call(handles[i], args[i])
            if rest:
                for i, r in zip(rest, many([handles[i] for i in rest], [args[i] for i in rest])):
                    out[i] = r
            for i, future in futures.items():
                out[i] = future.result()
        return out
    return run


# another run's memory (--memory_from)
def seed_memory(mem, path: str, setting: str) -> int:
    """--memory_from: add another run's memory records (RUN_DIR/memory.json) or an export's
    environments (EXPORT_DIR/manifest.json), oldest first; returns how many were added."""
    p = Path(path)
    try:
        if (p / "memory.json").is_file():
            data = json.loads((p / "memory.json").read_text(encoding="utf-8"))
            records = list(memory_lib.EnvironmentMemory.from_dict(data).records)
        elif (p / "manifest.json").is_file():
            m = json.loads((p / "manifest.json").read_text(encoding="utf-8"))
            records = [memory_lib.MemoryRecord(
                skill=e["skill"], source=(p / m["package"] / e["source_file"]).read_text("utf-8"),
                win_rate=e["win_rate"] or 0.0, regret=e["regret"] or 0.0, step=e["step"],
                class_name=e["class_name"], setting=m["setting"]) for e in m["envs"]]
        else:
            raise SystemExit(f"--memory_from {path}: no memory.json (a run directory) or "
                             "manifest.json (a tools/export.py package) there")
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SystemExit(f"--memory_from {path}: unreadable ({type(e).__name__}: {e})") from None
    kept = sorted((r for r in records if r.setting == setting), key=lambda r: r.step)
    for r in kept:
        mem.add(r)
    return len(kept)
