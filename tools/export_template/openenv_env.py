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
WebSocket session (GET /ws) gets its own `SpadeEnvironment`, so its own episode in a sandbox
worker (proxy.py: the code never runs in the server's process), with its own scratch tmpfs as
root. reset(seed, index, episode_id): seed an int in SEED_RANGE or null, episode_id a string
of at most 200 characters or null; anything else is refused with one error frame saying why.

Actions are {"message": str}: at most ACTION_CAP characters, valid UTF-8, no NUL; anything else is
refused with an error frame (a non-string: openenv's VALIDATION_ERROR; the rest: EXECUTION_ERROR
saying why), and the session and its episode go on. Observations: `text` (at most
sandbox.OBS_CAP characters), reward, done = terminated or truncated, `terminated`, `truncated`,
`env_id` (the manifest's id), `env_reward` (the environment's own reward of the step). A fault
of the environment's code (a timeout, an exception, a malformed result: sandbox.FAULT_KINDS) ends
the episode with done, reward 0.0 and `error` naming the kind; reset() starts a fresh episode.

Reward: OpenEnv's `reward` is 0.0 on every step but the last, and on the last the episode's return
as SPADE's loop counts it (agent.episode_return: the environment's last reward clipped to [-1, 1]
if it terminated, else 0), so a client that sums a session's rewards (verifiers' OpenEnv
taskset, prime-rl) and one that reads the last (TRL, the trainer's openenv: pools) get the
return training gave the episode.

What the server holds to against its clients (`Guard`, in front of openenv's app):
1. Sessions end: a WebSocket that sends nothing for --idle_timeout seconds is closed (code 1008)
   and its session and worker with it; at --max_sessions the next one gets openenv's
   CAPACITY_REACHED frame. Sessions without a socket cannot be made: POST /mcp (openenv's
   session/create) and /ws?session_id= (attaching to one) are refused.
2. One budget: only /ws runs environments. openenv's HTTP /reset, /step and /state (each made a
   fresh environment outside --max_sessions) are not served (its "production" mode), nor
   openenv's web interface: the server refuses to start with ENABLE_WEB_INTERFACE set.
3. Bounded requests: an HTTP body over BODY_CAP bytes gets 413; a WebSocket frame over FRAME_CAP
   (the longest step a valid action makes) is closed with 1009.
4. Local: a Host other than 127.0.0.1 / localhost / [::1] / --host / --allow_host, or any
   browser Origin but this server's own and --allow_origin, gets 403 (a web page cannot reach
   the server, nor a DNS-rebinding one read it).
5. It prints its sandbox level at start; --require_full refuses to serve below sandbox.FULL.
Options: --step_timeout (seconds per call, 5.0), --episode_timeout (120.0), --memory_mb (1024),
--scratch_mb (256, each worker's), --max_sessions (8), --idle_timeout (600.0: longer than the
slowest client turn), --allow_host / --allow_origin (repeatable), --require_full.
"""
import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Optional
from urllib.parse import parse_qs, urlsplit

from openenv.core.env_server import (Action, Environment, Observation, State,
                                     create_fastapi_app)
from pydantic import Field

from .proxy import EnvironmentFault, SandboxedEnv, acquire

HERE = Path(__file__).resolve().parent
MANIFEST = json.loads((HERE / "manifest.json").read_text(encoding="utf-8"))
SPLIT = "curriculum"
ACTION_CAP = 1 << 20
# The longest step frame a valid action makes: ACTION_CAP characters of JSON-escaped text, at most
# 12 bytes each (a character outside the BMP as a \uXXXX\uXXXX pair), and the envelope.
FRAME_CAP = 12 * ACTION_CAP + (1 << 10)
BODY_CAP = 1 << 16  # HTTP bodies: the task API's requests are a few dozen bytes
SEED_RANGE = (0, 2**31 - 1)  # the manifest's seed_range: training's 31-bit seeds
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")
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


def reset_refusal(seed, episode_id) -> str | None:
    """Why reset's arguments are refused, or None. openenv hands the WebSocket's raw values over:
    a seed "5" would play another episode than 5 (random.Random hashes a str) while the state,
    a pydantic model, said 5; -1 would play the episode of 1 (Random takes abs())."""
    if seed is not None and (type(seed) is not int or not SEED_RANGE[0] <= seed <= SEED_RANGE[1]):
        return (f"seed {seed!r:.40}: an int in [{SEED_RANGE[0]}, {SEED_RANGE[1]}] (the manifest's "
                "seed_range), or null")
    if episode_id is not None and (type(episode_id) is not str or len(episode_id) > 200):
        return "episode_id: a string of at most 200 characters, or null"
    return None


def episode_reward(reward: float, terminated: bool) -> float:
    """OpenEnv's reward of a step (the module docstring's convention): the episode's return on
    a step that terminates it (its reward clipped to [-1, 1]), 0.0 on any other (a truncated
    episode's return is 0)."""
    return max(-1.0, min(1.0, float(reward))) if terminated else 0.0


class SpadeObservation(Observation):
    text: str = Field(default="", description="what the environment says")
    terminated: bool = False
    truncated: bool = False
    env_id: str = Field(default="", description="the manifest's id of the environment")
    error: Optional[str] = Field(default=None, description="a fault's kind (sandbox.FAULT_KINDS)")
    env_reward: Optional[float] = Field(default=None, description="the environment's own reward "
                                        "of the step (OpenEnv's reward: the episode's return, "
                                        "on its last step)")


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
        if (why := reset_refusal(seed, episode_id)) is not None:
            raise ValueError(why)                     # one error frame; the session goes on
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
        done = terminated or truncated
        return SpadeObservation(text=text, reward=episode_reward(reward, terminated),
                                done=done, terminated=terminated, truncated=truncated,
                                env_id=self._env.env_id, env_reward=reward)

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




def _hostname(host: str) -> str | None:
    """"[::1]:8000" -> "::1", "LocalHost:80" -> "localhost"; None for none."""
    return urlsplit("//" + host).hostname if host else None


async def _refuse(scope, receive, send, status: int, why: str) -> None:
    """An HTTP error response; for a WebSocket, the same before its handshake completes."""
    body, kind = why.encode(), scope["type"]
    head = {"status": status, "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                                          (b"content-length", str(len(body)).encode())]}
    if kind == "websocket":
        await receive()                                         # websocket.connect
        if "websocket.http.response" not in scope.get("extensions", {}):
            return await send({"type": "websocket.close", "code": 1008})
        kind = "websocket.http"
    await send({"type": f"{kind}.response.start", **head})
    await send({"type": f"{kind}.response.body", "body": body})


class Guard:
    """ASGI middleware in front of openenv's app: the checks it does not make itself (the module
    docstring's list): Host and Origin, the routes that make sessions without a socket, bodies
    over BODY_CAP, and WebSockets idle over idle_timeout seconds."""

    def __init__(self, app, hosts: set, origins: set, idle_timeout: float):
        self.app, self.hosts, self.origins, self.idle = app, hosts, origins, idle_timeout

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket"):                  # lifespan
            return await self.app(scope, receive, send)
        if (why := self.refusal(scope)) is not None:
            return await _refuse(scope, receive, send, *why)
        serve = self._http if scope["type"] == "http" else self._websocket
        return await serve(scope, receive, send)

    def refusal(self, scope) -> tuple[int, str] | None:
        hosts = [v.decode("latin-1") for k, v in scope["headers"] if k == b"host"]
        origins = [v.decode("latin-1") for k, v in scope["headers"] if k == b"origin"]
        if len(hosts) != 1 or _hostname(hosts[0]) not in self.hosts:
            return 403, f"Host {hosts!r:.80} is not this server's (--allow_host names others)"
        port = (scope.get("server") or ("", 0))[1]
        own = {f"http://{h}:{port}" for h in ("127.0.0.1", "localhost", "[::1]")}
        if origins and (len(origins) > 1 or origins[0].lower() not in own | self.origins):
            return 403, f"Origin {origins!r:.80} refused (--allow_origin names pages allowed)"
        if scope["path"] == "/mcp" or scope["path"].startswith(("/mcp/", "/web")):
            return 404, "not served: this environment is played over /ws only"
        if "session_id" in parse_qs(scope.get("query_string", b"").decode("latin-1")):
            return 403, "attaching to a session (?session_id=) is not served: one socket each"
        return None

    async def _http(self, scope, receive, send):
        """The body read whole first, at most BODY_CAP bytes (413 beyond), then the app."""
        body, more = b"", True
        while more:
            message = await receive()
            if message["type"] != "http.request":                      # the client left
                return
            body, more = body + message.get("body", b""), message.get("more_body", False)
            if len(body) > BODY_CAP:
                return await _refuse(scope, receive, send, 413, f"body over {BODY_CAP} bytes")
        first = [{"type": "http.request", "body": body, "more_body": False}]
        await self.app(scope, lambda: _pop_or(first, receive), send)

    async def _websocket(self, scope, receive, send):
        """The app's receive, ended as a disconnect after idle_timeout seconds of silence; the
        close that follows says so (1008)."""
        idle = []

        async def receive_or_idle():
            try:
                return await asyncio.wait_for(receive(), self.idle)
            except asyncio.TimeoutError:
                idle.append(True)
                return {"type": "websocket.disconnect", "code": 1008}

        async def send_close_says_why(message):
            if idle and message["type"] == "websocket.close":
                message = {**message, "code": 1008, "reason": f"idle over {self.idle:g} s"}
            await send(message)
        await self.app(scope, receive_or_idle, send_close_says_why)


async def _pop_or(first: list, receive):
    return first.pop() if first else await receive()


def app(max_sessions: int = 8, idle_timeout: float = 600.0, hosts=(), origins=()):
    """openenv's FastAPI app around SpadeEnvironment (WebSocket sessions and the task API; no
    HTTP reset, step or state), behind Guard."""
    inner = create_fastapi_app(SpadeEnvironment, SpadeAction, SpadeObservation,
                               max_concurrent_envs=max_sessions, env_name=MANIFEST["package"],
                               state_cls=SpadeState, mode="production")
    return Guard(inner, set(LOCAL_HOSTS) | {h.lower() for h in hosts},
                 {o.lower().rstrip("/") for o in origins}, idle_timeout)


def main(argv=None) -> None:
    pkg = MANIFEST["package"]
    ap = argparse.ArgumentParser(description=f"Serve {pkg}'s {len(MANIFEST['envs'])} "
                                 "environments over OpenEnv (the module docstring says how).")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--step_timeout", type=float, default=5.0)
    ap.add_argument("--episode_timeout", type=float, default=120.0)
    ap.add_argument("--memory_mb", type=int, default=1024)
    ap.add_argument("--scratch_mb", type=int, default=256)
    ap.add_argument("--max_sessions", type=int, default=8)
    ap.add_argument("--idle_timeout", type=float, default=600.0)
    ap.add_argument("--allow_host", action="append", default=[])
    ap.add_argument("--allow_origin", action="append", default=[])
    ap.add_argument("--require_full", action="store_true")
    a = ap.parse_args(argv)
    if os.environ.get("ENABLE_WEB_INTERFACE", "").lower() in ("true", "1", "yes"):
        raise SystemExit(f"{pkg}: ENABLE_WEB_INTERFACE is set, and openenv's web interface "
                         "shares one environment among all its clients: unset it")
    OPTIONS.update(step_timeout=a.step_timeout, episode_timeout=a.episode_timeout,
                   memory_mb=a.memory_mb, scratch_mb=a.scratch_mb, own_scratch=True)
    # the sessions' shared sandbox, started once and held for the server's life: an episode never
    # waits for a sandbox to start (proxy.py closes one with its last environment otherwise)
    try:
        _, sb = acquire(dict(OPTIONS, require_full=a.require_full))
    except RuntimeError as e:
        raise SystemExit(f"{pkg}: {e}") from None
    print(f"[{pkg}] sandbox level {sb.level}; http://{a.host}:{a.port}, at most "
          f"{a.max_sessions} sessions, each closed after {a.idle_timeout:g} s idle",
          file=sys.stderr, flush=True)
    import uvicorn
    uvicorn.run(app(a.max_sessions, a.idle_timeout, [a.host, *a.allow_host], a.allow_origin),
                host=a.host, port=a.port, log_level="warning", ws_max_size=FRAME_CAP)


if __name__ == "__main__":
    main()
