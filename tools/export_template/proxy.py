"""A SPADE environment behind a process sandbox: the object gem.make / gymnasium.make return.

Every environment in this package is Python that a language model wrote while training with
SPADE (arXiv 2608.19197). Its code never runs in your process: `SandboxedEnv` relays reset() and
step() to a sandbox worker (sandbox.py: a separate, locked-down interpreter, a fresh process per
episode; its docstring lists the layers and what they do not cover). An honest environment
behaves as it did in training: the same seed and actions give the same observations and rewards.
A faulty or hostile one raises `EnvironmentFault` within `step_timeout` seconds of the call (plus
a small overrun); it never hangs your process, and reset() starts a fresh episode afterwards.

Options, as keyword arguments of gem.make / gymnasium.make: step_timeout (seconds per call, 5.0),
episode_timeout (seconds of worker time per episode, 120.0), memory_mb (1024), cpu_seconds (300),
scratch_mb (256: the scratch tmpfs, as root), own_scratch (False: one tmpfs for all workers; True:
each worker its own, as the OpenEnv server runs them), landlock / seccomp (True; False only to
debug), require_full (False; True raises unless every layer of sandbox.FULL holds on this
machine). The sandbox applies every layer the machine allows
(root adds namespaces and a per-worker uid); `env.sandbox_level` names them. Environments made
with the same options share one sandbox, closed with the last of them (env.close()) and at
interpreter exit.
"""
import atexit
import threading
from pathlib import Path

from . import sandbox

HERE = Path(__file__).resolve().parent
_SHARED: dict = {}  # options -> [Sandbox, number of open environments using it]
_LOCK = threading.Lock()


class EnvironmentFault(RuntimeError):
    """The environment's code failed: `kind` is one of sandbox.FAULT_KINDS (timeout, step_error,
    memory_limit, invalid_observation, ...). Its episode is over; reset() starts a new one."""

    def __init__(self, env_id: str, kind: str, message: str):
        super().__init__(f"{env_id}: {kind}: {message}")
        self.kind = kind


def acquire(options: dict) -> tuple:
    """(key, sandbox): the one Sandbox this process shares among environments built with the same
    `options` (its use counted under `key`); with require_full, a RuntimeError below level full."""
    require_full = options.pop("require_full", False)
    key = tuple(sorted(options.items()))
    with _LOCK:
        if key not in _SHARED:
            _SHARED[key] = [sandbox.Sandbox(workers=1, pool=1, **options), 0]
        _SHARED[key][1] += 1
        sb = _SHARED[key][0]
    if require_full and not sb.level.startswith("full"):
        _release(key)
        raise RuntimeError(f"require_full: this machine gives sandbox level {sb.level}")
    return key, sb


def _release(key: tuple) -> None:
    with _LOCK:
        entry = _SHARED.get(key)
        if entry is not None:
            entry[1] -= 1
            if entry[1] <= 0:
                del _SHARED[key]
                entry[0].close()


@atexit.register
def _close_all() -> None:
    with _LOCK:
        for sb, _ in _SHARED.values():
            sb.close()
        _SHARED.clear()


class SandboxedEnv:
    """One exported environment: text in, text out, its code inside the sandbox.

    reset(seed) -> (observation, info); step(action) -> (observation, reward, terminated,
    truncated, info); tools() -> the OpenAI tool schemas of a tool-use environment ([] for games).
    """

    def __init__(self, source_file: str, setting: str = "games", name: str | None = None,
                 **options):
        self.env_id, self.setting = name or source_file, setting      # name: the registered id
        self.source = (HERE / source_file).read_text(encoding="utf-8")  # data: never run here
        self._key, self._sb = acquire(options)
        self.sandbox_level = self._sb.level
        self._handle, self._started = self._sb.open(self.source, setting), False

    def reset(self, seed: int | None = None) -> tuple[str, dict]:
        self._started = False
        result = self._check(self._open().reset(seed))     # a fresh worker for every episode
        self._started = True
        return result

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        if not self._started:
            raise RuntimeError(f"{self.env_id}: no episode is running: call reset() first")
        self._started = False
        obs, reward, terminated, truncated, info = self._check(self._open().step(action))
        self._started = not (terminated or truncated)
        return obs, reward, terminated, truncated, info

    def tools(self) -> list[dict]:
        return self._open().tools()

    def close(self) -> None:
        """End the episode's worker; the shared sandbox closes with its last environment."""
        if self._handle is not None:
            self._handle.close()
            self._handle = None
            _release(self._key)

    def _open(self):
        if self._handle is None:
            raise RuntimeError(f"{self.env_id}: the environment is closed")
        return self._handle

    def _check(self, result: tuple) -> tuple:
        """The result, or EnvironmentFault for a fault. The sandbox marks a fault on the result
        object (a sandbox.Fault, its `fault` attribute the kind), as in training, never in the
        info: an environment's own info ("error" keys included) comes back as it wrote it."""
        if (kind := getattr(result, "fault", None)) is not None:
            raise EnvironmentFault(self.env_id, kind, result.message)
        return tuple(result)
