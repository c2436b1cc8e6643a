"""OpenEnv servers as pool environments: a hardened client, and the rounds that respect their
capacity (infrastructure, none of it the paper's).

A pool source `openenv:URL` (`--fixed_envs`, `--fallback_envs`; imported.py reads the pool's
specs) is an OpenEnv server on this machine (http://127.0.0.1:PORT), e.g. a tools/export.py
--format openenv package's; `#k=v&...` after the URL are its reset() arguments (`#index=2`: the
package's third environment).

An OpenEnv server is a peer, not a library: `RemoteEnv` plays it over openenv's WebSocket
protocol (`OpenEnvRemote`), its code in the server's process, and holds against a hostile one:
1. every call within REMOTE_TIMEOUT seconds whole (the schema, connect and first answer count as
   one), an episode's calls within REMOTE_EPISODE_TIMEOUT together: `timeout`, `episode_timeout`;
2. a reply frame over FRAME_CAP bytes or a GET /schema over SCHEMA_CAP is `output_too_large`;
3. its own sockets: no redirect is followed and no proxy (http_proxy, ...) applies, so a URL on
   this machine stays on this machine;
4. replies typed as the sandbox types its workers' (sandbox.check_reset / check_step: int or
   float rewards in [-10, 10], null meaning none; real booleans; clean text), a fault kind from
   sandbox.FAULT_KINDS (else protocol_violation), every message shortened and printable;
5. websockets' keepalive is off (its pings draw from the global `random`), so nothing here moves
   the trainer's RNG; a `#seed=` in the URL (every episode one seed) is refused.
train.play_pool plays a pool with OpenEnv entries through imported.batched (OpenEnv handles in
threads, at once) and `play_rounds`: a round opens sessions until a server refuses one (its
capacity), plays those episodes, closes them, and the rest wait for the next round; none is
dropped, and a server whose every session others hold for BUSY_WAIT seconds stops the run
(ServerFull).
Dependencies: websockets (openenv 0.10's protocol, lazily), sandbox.py.
Test: `pytest tests/test_openenv_hostile.py tests/test_export.py -m ""` (-m "": the slow tier too).
"""
from __future__ import annotations

import contextlib
import json
import re
import socket
import struct
import time

import sandbox

LOCAL = ("127.0.0.1", "localhost", "::1")
REMOTE_TIMEOUT = 120.0          # seconds one call may take, whole (open: schema, connect, answer)
REMOTE_EPISODE_TIMEOUT = 600.0  # seconds an episode's calls may take together (reset included)
FRAME_CAP = 1 << 21             # bytes of one reply: OBS_CAP characters of JSON and room to spare
SCHEMA_CAP = 1 << 20            # bytes of GET /schema's whole response
BUSY_WAIT = 120.0               # seconds every session may be refused before play_rounds gives up
_INT = re.compile(r"-?(0|[1-9][0-9]*)")


def remote_url(spec: str) -> tuple[str, dict]:
    """`openenv:URL#k=v&...` -> (URL, reset arguments; numbers parsed); refuses a remote host,
    a number written otherwise than JSON writes it (`02`, `²`), a key given twice, and `seed`:
    every episode's seed comes from the run, one in the URL would play every episode alike."""
    from urllib.parse import parse_qsl, urlsplit
    url, _, frag = spec.split(":", 1)[1].partition("#")
    parts = urlsplit(url)
    try:
        local = parts.scheme in ("http", "ws") and parts.hostname in LOCAL and parts.port
    except ValueError:  # a port that is not a number
        local = False
    if not local:
        raise SystemExit(f"{spec}: an OpenEnv server on this machine, http://127.0.0.1:PORT")
    kwargs = {}
    for k, v in parse_qsl(frag, keep_blank_values=True):
        if k == "seed" or k in kwargs:
            raise SystemExit(f"{spec}: {k} " + ("given twice" if k in kwargs else "in the URL: "
                             "each episode's seed comes from the run (--seed)"))
        if v.lstrip("-").isdigit() and not _INT.fullmatch(v):
            raise SystemExit(f"{spec}: {k}={v}: a number in ASCII digits, no leading zero")
        kwargs[k] = int(v) if _INT.fullmatch(v) else v
    return url.rstrip("/"), kwargs


class Busy(Exception):
    """The server refused a session: every one of its sessions is in use."""


class ServerFull(RuntimeError):
    """An OpenEnv server refused every session for BUSY_WAIT seconds: the run cannot play it."""


def _left(deadline: float) -> float:
    """Seconds left before the deadline; a timeout fault once none are."""
    if (left := deadline - time.monotonic()) <= 0:
        raise sandbox.FaultError("timeout", f"no answer within {REMOTE_TIMEOUT:g} s")
    return left


def _get(netloc: str, address: tuple, path: str, deadline: float):
    """GET path as JSON, HTTP/1.0 on a socket of our own: no proxy and no redirect can apply,
    at most SCHEMA_CAP bytes, all of it within the deadline."""
    data = b""
    with socket.create_connection(address, timeout=_left(deadline)) as s:
        s.sendall(f"GET {path} HTTP/1.0\r\nHost: {netloc}\r\n\r\n".encode())
        while True:
            s.settimeout(_left(deadline))
            if not (chunk := s.recv(1 << 16)):
                break
            data += chunk
            if len(data) > SCHEMA_CAP:
                raise sandbox.FaultError("output_too_large", f"GET {path}: over {SCHEMA_CAP} bytes")
    head, _, body = data.partition(b"\r\n\r\n")
    status = head.split(b"\r\n", 1)[0].split(b" ")
    if status[1:2] != [b"200"]:
        raise sandbox.FaultError("reset_error", f"GET {path}: {status} (never followed)")
    return json.loads(body)


class OpenEnvRemote:
    """An OpenEnv server's environment as a text game, over openenv 0.10's WebSocket protocol:
    {"type": "reset" | "step" | "state" | "close", "data": {...}} frames answered by {"type":
    "observation", "data": {"observation", "reward", "done"}}, {"type": "state"} or {"type":
    "error"}. The reply fills the action's `message` field, else its only string field (from GET
    /schema); the text is the observation's `text` field, else its only string one; an `error`
    it names is a fault. Every call takes a deadline (time.monotonic()) and raises:
    sandbox.FaultError (a named fault), Busy, or what the socket raised."""

    def __init__(self, spec: str):
        from urllib.parse import urlsplit
        self.url, self.kwargs = remote_url(spec)
        parts = urlsplit(self.url)
        self.netloc, self.path = parts.netloc, parts.path
        self.address, self.field, self.ws = (parts.hostname, parts.port), None, None

    def open(self, deadline: float) -> None:
        """The action's field, then a session: a WebSocket on a socket of our own (so no proxy,
        no redirect), keepalive off (its pings draw from the global `random`), frames up to
        FRAME_CAP; a `state` request the server answers, or refuses when it is full."""
        from websockets.sync.client import connect
        props = _get(self.netloc, self.address, self.path + "/schema", deadline)["action"].get(
            "properties", {})
        names = [k for k, v in props.items() if v.get("type") == "string"]
        if "message" not in names and len(names) != 1:
            why = f"its action has no single string field: {props!r:.200}"
            raise sandbox.FaultError("reset_error", why)
        self.field = "message" if "message" in names else names[0]
        sock = socket.create_connection(self.address, timeout=_left(deadline))
        sock.settimeout(None)  # the connection's reader thread blocks; deadlines come per call
        self.ws = connect(f"ws://{self.netloc}{self.path}/ws", sock=sock, max_size=FRAME_CAP,
                          ping_interval=None, open_timeout=_left(deadline), close_timeout=5,
                          legacy=True)
        self._call({"type": "state"}, deadline)

    def _call(self, message: dict, deadline: float) -> dict:
        """One request and its reply's data, both within the deadline."""
        from websockets.exceptions import ConnectionClosed
        seconds = _left(deadline)
        with contextlib.suppress(OSError):  # the send's deadline: a server that never reads
            self.ws.socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack(
                "ll", int(seconds), int(seconds % 1 * 1e6)))
        with contextlib.suppress(ConnectionClosed):  # a server refusing the session closes at
            self.ws.send(json.dumps(message))       # once: its reason waits below to be read
        try:
            reply = json.loads(self.ws.recv(timeout=_left(deadline)))
        except TimeoutError:
            raise sandbox.FaultError("timeout", f"no answer within {REMOTE_TIMEOUT:g} s") from None
        except ConnectionClosed as e:
            if getattr(e.sent, "code", None) == 1009:
                why = f"a reply over {FRAME_CAP} bytes"
                raise sandbox.FaultError("output_too_large", why) from None
            raise
        if type(reply) is not dict or type(reply.get("data")) is not dict:
            why = "a reply that is not {type, data: {...}}"
            raise sandbox.FaultError("protocol_violation", why)
        if reply.get("type") == "error":
            why = sandbox.clean_message(reply["data"].get("message"))
            raise Busy(why) if reply["data"].get("code") == "CAPACITY_REACHED" else \
                sandbox.FaultError("step_error", why)
        return reply["data"]

    def reset(self, seed: int | None, deadline: float) -> tuple:
        d = self._call({"type": "reset", "data": {**self.kwargs, "seed": seed}}, deadline)
        return sandbox.check_reset(_observed(d), {})

    def step(self, action: str, deadline: float) -> tuple:
        d = self._call({"type": "step", "data": {self.field: action}}, deadline)
        text, obs = _observed(d), d["observation"]
        reward = 0.0 if d.get("reward") is None else d["reward"]  # openenv's "no reward"
        truncated = obs.get("truncated", False)
        # OpenEnv's done is terminated or truncated: both are checked as the sandbox's flags.
        text, reward, done, truncated, info = sandbox.check_step(
            text, reward, d.get("done"), truncated, {})
        return text, reward, done and not truncated, truncated, info

    def close(self) -> None:
        if self.ws is not None:
            with contextlib.suppress(Exception):
                self.ws.send(json.dumps({"type": "close"}))
            self.ws.close()
            self.ws = None


def _observed(data: dict) -> str:
    """An observation reply's text (the result checks follow: sandbox.check_reset / check_step);
    an `error` it names is that fault when it is one of sandbox.FAULT_KINDS."""
    obs = data.get("observation")
    if type(obs) is not dict:
        raise sandbox.FaultError("protocol_violation", "an observation that is not an object")
    if obs.get("error") is not None:
        kind = obs["error"] if obs["error"] in sandbox.FAULT_KINDS else "protocol_violation"
        meta = obs.get("metadata") if type(obs.get("metadata")) is dict else {}
        raise sandbox.FaultError(kind, meta.get("message", ""))
    strings = [v for v in obs.values() if type(v) is str]
    text = obs["text"] if "text" in obs else strings[0] if len(strings) == 1 else obs
    if type(text) is not str:
        why = f"observation of type {type(text).__name__}"
        raise sandbox.FaultError("invalid_observation", why)
    return text


class RemoteEnv:
    """An OpenEnv server's environment behind EnvHandle's surface (reset, step, tools, close):
    one session, opened by open() or the first reset, held until close(); each call within
    REMOTE_TIMEOUT seconds and an episode's calls within REMOTE_EPISODE_TIMEOUT together. Faults
    come back as sandbox.Fault results, as the sandbox's do; only opening raises (Busy), and
    play_rounds opens every session before its reset. It touches no global state (no RNG), so
    handles play in threads at once (batched)."""

    def __init__(self, spec: str):
        self.spec, self.remote = spec, OpenEnvRemote(spec)
        self.url, self.open_fault, self.playing, self._used = self.remote.url, None, False, 0.0

    def open(self) -> bool:
        """A session: True; False with its Fault kept for reset to return; Busy when full."""
        self.close()
        try:
            self.remote.open(time.monotonic() + REMOTE_TIMEOUT)
            return True
        except Busy:
            self.close()
            raise
        except Exception as e:  # noqa: BLE001 - a server's failure is its environment's fault
            self.open_fault = self._fault(e, "reset_error", step=False)
            return False

    def reset(self, seed: int | None = None) -> tuple[str, dict]:
        """A new episode on the session (opened first if there is none: Busy when full)."""
        if self.remote.ws is None and self.open_fault is None:
            self.open()
        if self.open_fault is not None:
            fault, self.open_fault = self.open_fault, None
            return fault
        self._used, self.playing = 0.0, True
        return self._timed(lambda deadline: self.remote.reset(seed, deadline), "reset_error")

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        if not self.playing:
            return sandbox.Fault.of("closed", "no episode is running", step=True)
        result = self._timed(lambda deadline: self.remote.step(action, deadline), "step_error")
        ended = getattr(result, "fault", None) is not None or result[2] or result[3]
        self.playing = not ended
        return result

    def _timed(self, call, kind: str):
        """call(deadline) within the call's and the episode's time; a raise is a fault."""
        left = REMOTE_EPISODE_TIMEOUT - self._used
        start, step = time.monotonic(), kind == "step_error"
        try:
            if left <= 0:
                raise sandbox.FaultError("episode_timeout", "episode time budget used up")
            return call(start + min(REMOTE_TIMEOUT, left))
        except Exception as e:  # noqa: BLE001
            if isinstance(e, sandbox.FaultError) and e.kind == "timeout" and left < REMOTE_TIMEOUT:
                e = sandbox.FaultError("episode_timeout", "episode time budget used up")
            return self._fault(e, kind, step)
        finally:
            self._used += time.monotonic() - start

    def _fault(self, e: Exception, kind: str, step: bool) -> sandbox.Fault:
        """The Fault of exception e (sandbox.Fault.of_error): a socket's timeout is `timeout`,
        any other failure `kind`."""
        self.close()
        return sandbox.Fault.of_error(e, "timeout" if isinstance(e, TimeoutError) else kind,
                                      step=step)

    def tools(self) -> list[dict]:
        return []

    def close(self) -> None:
        self.playing, self.open_fault = False, None
        with contextlib.suppress(Exception):
            self.remote.close()
        self.remote.ws = None


def play_rounds(specs: list, stream, play) -> list:
    """play(specs, stream) -> Episodes, in rounds that open at most each OpenEnv server's
    capacity of sessions: a round opens sessions for the waiting OpenEnv episodes until a server
    refuses one (Busy: full), plays them with every other episode not yet played, and closes
    them, so the next round finds them free. No episode is dropped: a server that refuses every
    session for BUSY_WAIT seconds raises ServerFull. Each episode keeps the request keys, hence
    the sampling seeds, of its place in `specs` (_Keyed). Returns one Episode per spec."""
    queue = [i for i, s in enumerate(specs) if isinstance(s.handle, RemoteEnv)]
    rest, out, waited = [i for i in range(len(specs)) if i not in queue], [None] * len(specs), 0.0
    while queue or rest:
        admitted, full = [], {}
        for i in queue:
            h = specs[i].handle
            if h.url not in full:
                try:
                    h.open()  # a failure is kept as the fault its reset returns: played, named
                    admitted.append(i)
                except Busy as e:
                    full[h.url] = e
        queue = [i for i in queue if i not in admitted]
        batch, rest = sorted(rest + admitted), []
        if not batch:  # every session held by others: wait for one, a while
            if waited >= BUSY_WAIT:
                url, why = next(iter(full.items()))
                raise ServerFull(f"openenv:{url} refused every session for {waited:g} s: {why}")
            time.sleep(min(2.0, BUSY_WAIT - waited))
            waited += min(2.0, BUSY_WAIT - waited)
            continue
        waited = 0.0
        try:
            for i, ep in zip(batch, play([specs[i] for i in batch], _Keyed(stream, batch))):
                out[i] = ep
        finally:
            for i in admitted:
                specs[i].handle.close()
    return out


class _Keyed:
    """A request stream (stream.Stream) whose key (j, n) goes in as (index[j], n)."""

    def __init__(self, stream, index: list):
        self.stream, self.index = stream, index
        self.back = {g: j for j, g in enumerate(index)}

    @property
    def pending(self) -> int:
        return self.stream.pending

    def submit(self, key: tuple, prompt, max_new_tokens: int | None = None) -> None:
        self.stream.submit((self.index[key[0]], key[1]), prompt, max_new_tokens)

    def collect(self, wait: bool = True) -> list:
        return [((self.back[i], n), c) for (i, n), c in self.stream.collect(wait)]

    def serve(self, fn):
        return self.stream.serve(fn)
