"""The OpenEnv face of an exported SPADE package: its environments behind openenv's own server.

    python -m <package>.openenv_env --port 8000        # 127.0.0.1 unless --host; --help
    from openenv.core import GenericEnvClient
    with GenericEnvClient(base_url="http://127.0.0.1:8000").sync() as client:
        r = client.reset(seed=0, index=1)              # manifest.json's envs[1] (default 0)
        r = client.step({"message": r"\\boxed{42}"})
        r.observation["text"], r.reward, r.done, r.observation["truncated"]

One server serves the whole package: its environments are the tasks of one split, "curriculum"
(OpenEnv's task API: GET /<package>/splits, POST /<package>/tasks and /<package>/task give the
manifest entries, with hint, skill, regret and win rate), and reset(index=i) picks one. Each
WebSocket session gets its own `SpadeEnvironment`, so its own episode in a sandbox worker
(proxy.py: the code never runs in the server's process).

Actions are {"message": str}: at most ACTION_CAP characters, valid UTF-8, no NUL; anything else is
refused with an error frame (a non-string: openenv's VALIDATION_ERROR; the rest: EXECUTION_ERROR
saying why), and the session and its episode go on. Observations: `text` (at most
sandbox.OBS_CAP characters), reward, done = terminated or truncated, `terminated`, `truncated`,
`env_id` (the manifest's id). A fault of the environment's code (a timeout, an exception, a
malformed result: sandbox.FAILURES) ends the episode with done, reward 0.0 and `error` naming the
kind; reset() starts a fresh episode. Server options: --step_timeout (seconds per call, 5.0),
--episode_timeout (120.0), --memory_mb (1024), --max_sessions (8).
"""
import argparse
import json
from pathlib import Path
from typing import Optional

from openenv.core.env_server import Action, Environment, Observation, State, create_app
from pydantic import Field

from .proxy import EnvironmentFault, SandboxedEnv, _acquire

HERE = Path(__file__).resolve().parent
MANIFEST = json.loads((HERE / "manifest.json").read_text(encoding="utf-8"))
SPLIT = "curriculum"
ACTION_CAP = 1 << 20
OPTIONS: dict = {}  # the sandbox options this server was started with (main)


class SpadeAction(Action):
    message: str = Field(description=f"the agent's reply, whole: at most {ACTION_CAP} "
                                     "characters of UTF-8, no NUL")


def refusal(message: str) -> str | None:
    """Why a message is not an action, or None. Checked in step(), not by the model: openenv's
    server echoes a validation error's input, and a lone surrogate or megabytes echoed back would
    cost the session (it cannot serialise the one) or the bandwidth (the other)."""
    if len(message) > ACTION_CAP:
        return f"the message has {len(message)} characters; at most {ACTION_CAP}"
    if "\x00" in message:
        return "the message contains NUL"
    try:
        message.encode("utf-8")
    except UnicodeEncodeError:
        return "the message is not valid UTF-8 (a lone surrogate)"
    return None


class SpadeObservation(Observation):
    text: str = Field(default="", description="what the environment says")
    terminated: bool = False
    truncated: bool = False
    env_id: str = Field(default="", description="the manifest's id of the environment")
    error: Optional[str] = Field(default=None, description="a fault's kind (sandbox.FAILURES)")


class SpadeState(State):
    env_id: Optional[str] = None
    seed: Optional[int] = None


class SpadeEnvironment(Environment):
    """One session: one environment of the package at a time, each episode in a fresh worker."""
    SUPPORTS_CONCURRENT_SESSIONS = True  # sessions share nothing but the sandbox's zygote

    def __init__(self):
        super().__init__()
        self._env, self._state = None, SpadeState()

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None,
              index: int = 0) -> SpadeObservation:
        e = self.get_task(SPLIT, index)
        if self._env is None or self._env.env_id != e["id"]:
            self.close()
            self._env = SandboxedEnv(e["source_file"], MANIFEST["setting"], name=e["id"],
                                     **OPTIONS)
        self._state = SpadeState(episode_id=episode_id, env_id=e["id"], seed=seed)
        try:
            text, _ = self._env.reset(seed)
        except EnvironmentFault as fault:
            return self._fault(fault)
        return SpadeObservation(text=text, env_id=e["id"])

    def step(self, action: SpadeAction, timeout_s: Optional[float] = None) -> SpadeObservation:
        if self._env is None:
            raise RuntimeError("no episode is running: reset first")
        if (why := refusal(action.message)) is not None:  # the client hears why; episode goes on
            raise ValueError(why)
        try:
            text, reward, terminated, truncated, _ = self._env.step(action.message)
        except EnvironmentFault as fault:
            return self._fault(fault)
        self._state.step_count += 1
        return SpadeObservation(text=text, reward=reward, done=terminated or truncated,
                                terminated=terminated, truncated=truncated,
                                env_id=self._env.env_id)

    def _fault(self, fault: EnvironmentFault) -> SpadeObservation:
        return SpadeObservation(text=f"[environment error: {fault.kind}]", reward=0.0, done=True,
                                terminated=True, env_id=self._env.env_id, error=fault.kind,
                                metadata={"message": str(fault)[:300]})

    @property
    def state(self) -> SpadeState:
        return self._state

    def close(self) -> None:
        if self._env is not None:
            self._env.close()
            self._env = None

    # OpenEnv's task API: the package's environments as the tasks of one split
    def list_splits(self) -> list:
        return [SPLIT]

    def list_tasks(self, split: str) -> list:
        if split != SPLIT:
            raise ValueError(f"no split {split!r}: this package has {SPLIT!r}")
        return MANIFEST["envs"]

    def num_tasks(self, split: str) -> int:
        return len(self.list_tasks(split))

    def get_task(self, split: str, index: int) -> dict:
        tasks = self.list_tasks(split)
        if type(index) is not int or not 0 <= index < len(tasks):
            raise IndexError(f"index {index!r}: this package has tasks 0..{len(tasks) - 1}")
        return tasks[index]

    def get_task_range(self, split: str, start: Optional[int] = None,
                       stop: Optional[int] = None) -> list:
        return self.list_tasks(split)[start:stop]


def app(max_sessions: int = 8):
    """The FastAPI app openenv's create_app builds around SpadeEnvironment."""
    return create_app(SpadeEnvironment, SpadeAction, SpadeObservation,
                      env_name=MANIFEST["package"], max_concurrent_envs=max_sessions,
                      state_cls=SpadeState)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=f"Serve {MANIFEST['package']}'s "
                                 f"{len(MANIFEST['envs'])} environments over OpenEnv.")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--step_timeout", type=float, default=5.0)
    ap.add_argument("--episode_timeout", type=float, default=120.0)
    ap.add_argument("--memory_mb", type=int, default=1024)
    ap.add_argument("--max_sessions", type=int, default=8)
    a = ap.parse_args(argv)
    OPTIONS.update(step_timeout=a.step_timeout, episode_timeout=a.episode_timeout,
                   memory_mb=a.memory_mb)
    # the sessions' shared sandbox, started once and held for the server's life: an episode never
    # waits for a sandbox to start (proxy.py closes one with its last environment otherwise)
    _acquire(dict(OPTIONS))
    import uvicorn
    uvicorn.run(app(a.max_sessions), host=a.host, port=a.port, log_level="warning")


if __name__ == "__main__":
    main()
