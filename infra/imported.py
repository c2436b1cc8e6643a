"""Environments from outside this run, for the pools of infra/baseline.py: GEM, Gymnasium and
OpenEnv ids, played in this process; and another run's memory (--memory_from).

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

An imported environment is trusted library code, not model-written: it is played in this process
by `InProcessEnv`, which has EnvHandle's surface (reset, step, tools, close), so agent.play and the
pool's statistics treat it as any other environment. Its semantics follow the sandbox's: a fresh
instance per episode (an episode depends only on its seed), the global `random` / `numpy.random`
states it sees are its own, seeded from the episode's seed and set aside between calls (GEM's reset
seeds them), and an exception or a malformed result is an environment fault with a named kind.
Unlike the sandbox there is no deadline: a hanging library call hangs the run. An OpenEnv server
is played over its WebSocket protocol (`OpenEnvRemote`: one session per episode, a reply that
takes over REMOTE_TIMEOUT seconds is a `timeout` fault); its code runs in the server's process.
train.play_pool opens an InProcessEnv per episode of such an entry, and batches through `batched`
only when a pool holds one.

`seed_memory` (--memory_from) fills a new run's environment memory with another run's records
(memory.json) or an export's manifest (tools/export.py): exemplars for the designer's prompts,
text only, never executed here. Test: `pytest tests/test_export.py`.
"""
from __future__ import annotations

import contextlib
import fnmatch
import importlib
import json
import math
import random
import sys
from pathlib import Path

import memory as memory_lib
import sandbox

KINDS = ("gem:", "gymnasium:", "openenv:")
LOCAL = ("127.0.0.1", "localhost", "::1")


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
        return OpenEnvRemote(spec)
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


REMOTE_TIMEOUT = 120.0  # seconds an OpenEnv server may take to answer one reset or step


def remote_url(spec: str) -> tuple[str, dict]:
    """`openenv:URL#k=v&...` -> (URL, reset arguments; numbers parsed); refuses a remote host."""
    from urllib.parse import parse_qsl, urlsplit
    url, _, frag = spec.split(":", 1)[1].partition("#")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "ws") or parts.hostname not in LOCAL:
        raise SystemExit(f"{spec}: an OpenEnv server on this machine, http://127.0.0.1:PORT")
    kwargs = {k: json.loads(v) if v.lstrip("-").isdigit() else v for k, v in parse_qsl(frag)}
    return url.rstrip("/"), kwargs


class OpenEnvRemote:
    """An OpenEnv server's environment as a text game, over openenv 0.10's WebSocket protocol:
    {"type": "reset" | "step" | "close", "data": {...}} frames answered by {"type":
    "observation", "data": {"observation", "reward", "done"}} or {"type": "error"}. The reply
    fills the action's `message` field, else its only string field (from GET /schema); the text
    is the observation's `text` field, else its only string one; an `error` it names is a fault."""

    def __init__(self, spec: str):
        from urllib.request import urlopen
        from websockets.sync.client import connect
        url, self.kwargs = remote_url(spec)
        with urlopen(url.replace("ws://", "http://") + "/schema", timeout=30) as f:
            props = json.loads(f.read())["action"].get("properties", {})
        names = [k for k, v in props.items() if v.get("type") == "string"]
        if "message" not in names and len(names) != 1:
            raise ValueError(f"its action has no single string field to put a reply in: {props}")
        self.field = "message" if "message" in names else names[0]
        self._stack = contextlib.ExitStack()  # websockets 17: a connection is a context
        self.ws = self._stack.enter_context(connect(url.replace("http://", "ws://") + "/ws",
                                                    max_size=None, open_timeout=30))

    def _call(self, kind: str, data: dict) -> dict:
        self.ws.send(json.dumps({"type": kind, "data": data}))
        try:
            reply = json.loads(self.ws.recv(timeout=REMOTE_TIMEOUT))
        except TimeoutError:
            raise _Invalid("timeout", f"no answer in {REMOTE_TIMEOUT} s") from None
        if reply.get("type") == "error":
            raise _Invalid("step_error", str(reply.get("data", {}).get("message"))[:300])
        obs = reply["data"].get("observation") or {}
        if obs.get("error"):
            raise _Invalid(str(obs["error"]), str(reply["data"].get("metadata") or "")[:300])
        return reply["data"]

    def _say(self, obs: dict):
        strings = [v for v in obs.values() if isinstance(v, str)]
        return obs["text"] if "text" in obs else strings[0] if len(strings) == 1 else obs

    def reset(self, seed: int | None = None) -> tuple:
        return self._say(self._call("reset", {"seed": seed, **self.kwargs})["observation"]), {}

    def step(self, action: str) -> tuple:
        d = self._call("step", {self.field: action})
        truncated = d["observation"].get("truncated", False)
        return (self._say(d["observation"]), d.get("reward") or 0.0, bool(d["done"]) and not
                truncated, truncated, {})

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.ws.send(json.dumps({"type": "close", "data": {}}))
        self._stack.close()


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
            return _text(obs), _info(info)
        except Exception as e:  # noqa: BLE001 - library failures are environment faults
            return self._fault(getattr(e, "kind", "reset_error"), e, step=False)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        if self.env is None:
            return self._fault("closed", "no episode is running")
        try:
            with _rngs(self._state):
                obs, reward, terminated, truncated, info = self.env.step(action)
            return _text(obs), _reward(reward), _flag(terminated), _flag(truncated), _info(info)
        except Exception as e:  # noqa: BLE001
            return self._fault(getattr(e, "kind", "step_error"), e)

    def tools(self) -> list[dict]:
        return []

    def close(self) -> None:
        if self.env is not None:
            _close(self.env)
            self.env = None

    def _fault(self, kind: str, e, step: bool = True) -> sandbox.Fault:
        self.close()
        msg = (f"{type(e).__name__}: {e}" if isinstance(e, Exception) else str(e))[:300]
        obs = f"[environment error: {kind}] {msg}"
        r = sandbox.Fault((obs, 0.0, True, False, {}) if step else (obs, {}))
        r.fault, r.message = kind, msg
        return r


def _close(env) -> None:
    with contextlib.suppress(Exception):                             # GEM envs have no close()
        getattr(env, "close", lambda: None)()


class _Invalid(ValueError):
    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


# The checks the sandbox's parent applies to every reply (sandbox.EnvHandle._check_step).
def _text(obs) -> str:
    if not isinstance(obs, str):
        raise _Invalid("invalid_observation", f"observation of type {type(obs).__name__}")
    try:
        obs.encode("utf-8")                                          # no lone surrogate
    except UnicodeEncodeError:
        raise _Invalid("invalid_observation", "observation: lone surrogate") from None
    if "\x00" in obs:
        raise _Invalid("invalid_observation", "observation: contains NUL")
    return str(obs)[:sandbox.OBS_CAP]


def _reward(r) -> float:
    try:
        r = float(r)
    except (TypeError, ValueError):
        raise _Invalid("invalid_reward", f"reward {r!r:.40} is not a number") from None
    if not (math.isfinite(r) and -10 <= r <= 10):
        raise _Invalid("invalid_reward", f"reward {r!r} is not a finite number in [-10, 10]")
    return r


def _flag(x) -> bool:
    if type(x).__name__ not in ("bool", "bool_"):
        raise _Invalid("invalid_result", "terminated/truncated are not bools")
    return bool(x)


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
    try:
        with _rngs({"random": random.Random(0).getstate()}):
            _close(make(spec))
    except Exception as e:  # noqa: BLE001 - an unknown id, a missing package: the user's to fix
        raise SystemExit(f"{spec}: cannot make it: {type(e).__name__}: {e}") from None
    h = InProcessEnv(spec)
    result = h.reset(seed=0)
    name = type(getattr(h.env, "unwrapped", h.env)).__name__
    result = result if isinstance(result, sandbox.Fault) else h.step(sandbox.PROBE_ACTIONS[0])
    h.close()
    if isinstance(result, sandbox.Fault):
        print(f"[spade] {spec} left out of the pool: {result.fault}: {result.message}",
              file=sys.stderr)
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


# playing a pool that mixes sandbox handles and in-process environments
def batched(sb, step: bool):
    """step_many / reset_many for agent.play: sandbox handles in one batch, the rest in turn."""
    many = getattr(sb, "step_many" if step else "reset_many", None)   # None: one at a time

    def run(handles, args):
        direct = [many is None or isinstance(h, InProcessEnv) for h in handles]
        out = [(h.step(a) if step else h.reset(a)) if d else None
               for h, a, d in zip(handles, args, direct)]
        rest = [i for i, d in enumerate(direct) if not d]
        if rest:
            for i, r in zip(rest, many([handles[i] for i in rest], [args[i] for i in rest])):
                out[i] = r
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
