"""The OpenEnv surfaces against hostile peers, one property per test, loopback only.

The exported server (tools/export_template/openenv_env.py behind openenv 0.10's app, run in the
export virtualenv as a user runs it) is played by small hostile clients: items 1-7 of
docs/export.md's "Against hostile peers". The trainer's client (infra/openenv.py: RemoteEnv,
OpenEnvRemote, play_rounds) is driven against small hostile servers written here on
websockets' sans-I/O protocol, which misbehave as each test tells them: items 8-13.
Idle times and deadlines are shrunk (server flags, monkeypatched constants) to keep each test
to seconds.
"""
import ast
import contextlib
import http.client
import json
import os
import random
import socket
import subprocess
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.frames import Opcode
from websockets.server import ServerProtocol
from websockets.sync.client import connect

import agent
import sandbox
from infra import imported, openenv
from export_venv import export_python, free_port, healthy
from runs import TINY, agent_engine
from scripted import main_with
from tools import export

PKG, IDLE = "hostile", 2.0
FRAME_CAP = 12 * (1 << 20) + (1 << 10)  # openenv_env.FRAME_CAP
ECHO = r'''
class EchoEnv:
    def reset(self, seed=None):
        self.n = 0
        return "seed %r" % (seed,), {}

    def step(self, action):
        self.n += 1
        if action.startswith("fill"):  # fill<N>: N files of 1 MiB in its scratch dir
            n = 0
            try:
                for i in range(int(action[4:])):
                    with open("f%d.bin" % i, "wb") as f:
                        f.write(b"x" * (1 << 20))
                    n += 1
                out = "filled"
            except OSError as e:
                out = "errno %d" % e.errno
            return "%s %d" % (out, n), 0.0, False, False, {}
        return "heard " + action[:20], 1.0, self.n >= 3, False, {}
'''


# ----------------------------------------------------------------------------------------------
# The exported server, items 1-7

@pytest.fixture(scope="module")
def package(tmp_path_factory):
    """An OpenEnv package of one environment, written as tools/export.py writes one."""
    out = tmp_path_factory.mktemp("hostile") / "pkg"
    manifest = {"package": PKG, "format": "openenv", "run": "r", "config_hash": "sha256:0",
                "model": "m", "setting": "games", "sandbox_level": None, "filters": {},
                "excluded": [], "envs": [{"id": f"{PKG}/EchoEnv-e0-v0", "env_id": "e0",
                                          "class_name": "EchoEnv", "source_file": "envs/e0.py"}]}
    export.write_package(out, manifest, {"e0": ECHO}, [])
    return out


def start(pkg: Path, cwd: Path, *flags, env: dict | None = None):
    """`python -m hostile.openenv_env --port P FLAGS` in the export venv: (process, port, log)."""
    port, log = free_port(), cwd / f"server-{len(list(cwd.iterdir()))}.log"
    proc = subprocess.Popen([str(export_python()), "-P", "-m", f"{PKG}.openenv_env", "--port",
                             str(port), *flags], cwd=cwd, stdout=log.open("w"),
                            stderr=subprocess.STDOUT,
                            env={"PATH": os.environ["PATH"], "HOME": str(cwd),
                                 "PYTHONPATH": str(pkg), **(env or {})})
    return proc, port, log


def stop(proc) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def server(package, tmp_path_factory):
    """The package served with 2 sessions, IDLE seconds of idleness, a 4 MiB scratch each, and one
    host and one origin named by the user."""
    cwd = tmp_path_factory.mktemp("cwd")
    proc, port, log = start(package, cwd, "--max_sessions", "2", "--idle_timeout", str(IDLE),
                            "--scratch_mb", "4", "--allow_host", "trusted.example",
                            "--allow_origin", "http://trusted.example")
    url = f"http://127.0.0.1:{port}"
    try:
        assert healthy(url, proc), log.read_text()[-3000:]
        yield SimpleNamespace(url=url, port=port, proc=proc, log=log, cwd=cwd)
        assert healthy(url, proc, 10.0), "the server stopped serving"
    finally:
        stop(proc)


def ws(server, query: str = "", **kwargs):
    return connect(f"ws://127.0.0.1:{server.port}/ws{query}", open_timeout=30, legacy=True,
                   **kwargs)


def call(sock, kind: str, data: dict | None = None) -> dict:
    sock.send(json.dumps({"type": kind, **({} if data is None else {"data": data})}))
    return json.loads(sock.recv(timeout=30))


def request(server, method: str, path: str, body=None, headers: dict | None = None):
    """(status, body) of one plain HTTP request (no proxy, no redirect)."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        conn.request(method, path, body=body, headers=headers or {},
                     encode_chunked=not isinstance(body, (bytes, type(None))))
        r = conn.getresponse()
        return r.status, r.read().decode("utf-8", "replace")
    finally:
        conn.close()


def descendants(pid: int) -> set[int]:
    """The processes below pid (its sandbox's zygote and workers)."""
    parent = {}
    for p in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError, IndexError):
            parent[int(p)] = int(Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[1])
    out, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, pp in parent.items() if pp in frontier} - out
        out |= frontier
    return out


@pytest.mark.slow
@pytest.mark.needs_export_venv
def test_1_sessions_end_when_idle_and_a_full_server_says_so_and_recovers(server):
    """Two silent WebSockets hold both sessions; the third hears CAPACITY_REACHED. No session can
    be made without a socket (session/create, ?session_id= attaching). After IDLE s the silent
    ones are closed with 1008, saying why, and the server takes a new one."""
    silent = [ws(server), ws(server)]
    time.sleep(0.5)                                      # both sessions made
    with ws(server) as third:                           # told unasked, then closed
        full = json.loads(third.recv(timeout=30))
    assert full["data"]["code"] == "CAPACITY_REACHED" and "2/2" in full["data"]["message"]
    status, _ = request(server, "POST", "/mcp", json.dumps(
        {"jsonrpc": "2.0", "id": 1, "method": "openenv/session/create", "params": {}}),
        {"Content-Type": "text/plain"})
    assert status == 404
    with pytest.raises(InvalidStatus) as refused:
        ws(server, "?session_id=00000000-0000-0000-0000-000000000000")
    assert refused.value.response.status_code == 403
    for s in silent:
        with pytest.raises(ConnectionClosed) as closed:
            s.recv(timeout=IDLE + 10)
        assert closed.value.rcvd.code == 1008 and "idle" in closed.value.rcvd.reason
    with ws(server) as again:
        assert call(again, "reset", {"seed": 1})["data"]["observation"]["text"] == "seed 1"


@pytest.mark.slow
@pytest.mark.needs_export_venv
def test_2_only_websocket_sessions_run_environments(server):
    """With both sessions playing, openenv's HTTP /reset (a fresh environment per request,
    outside --max_sessions) and the web interface's routes run nothing: not served."""
    with ws(server) as a, ws(server) as b:
        for s in (a, b):
            assert call(s, "reset", {"seed": 0})["type"] == "observation"
        before = descendants(server.proc.pid)
        for path in ("/reset", "/step", "/web/reset"):
            assert request(server, "POST", path, b'{"seed": 0, "index": 0}',
                           {"Content-Type": "application/json"})[0] == 404
        assert request(server, "GET", "/state")[0] == 404
        assert descendants(server.proc.pid) == before      # no worker came


@pytest.mark.slow
@pytest.mark.needs_export_venv
def test_3_bodies_and_frames_are_bounded_to_the_protocol(server):
    """An HTTP body over 64 KiB gets 413, whether declared or streamed in chunks; a WebSocket
    frame over FRAME_CAP is closed with 1009, while the longest valid action still plays."""
    path, small = f"/{PKG}/tasks", b'{"split": "curriculum"}'
    headers = {"Content-Type": "application/json"}
    assert request(server, "POST", path, small, headers)[0] == 200
    big = b'{"split": "curriculum", "pad": "' + b"x" * (1 << 20) + b'"}'
    assert request(server, "POST", path, big, headers)[0] == 413
    assert request(server, "POST", path, iter([big[i:i + 4096] for i in range(0, len(big), 4096)]),
                   headers)[0] == 413
    with ws(server, max_size=None) as s:
        call(s, "reset", {"seed": 0})
        longest = call(s, "step", {"message": "\U0001F600" * (1 << 20)})  # 12 MiB of JSON
        assert longest["data"]["observation"]["text"].startswith("heard \U0001F600")
        s.send("x" * (FRAME_CAP + 1))
        with pytest.raises(ConnectionClosed) as closed:
            s.recv(timeout=30)
    assert closed.value.rcvd.code == 1009


@pytest.mark.slow
@pytest.mark.needs_export_venv
def test_4_foreign_hosts_and_origins_are_refused_unless_named(server):
    """A DNS-rebinding page (a foreign Host) reads nothing; a web page (a foreign Origin) can
    neither open a WebSocket nor POST a text/plain "simple request"; the names the user gave
    (--allow_host, --allow_origin) and the server's own origin are served."""
    path, body, json_type = f"/{PKG}/tasks", b'{"split": "curriculum"}', "application/json"
    assert request(server, "POST", path, body, {"Host": "evil.example:80"})[0] == 403
    for host in (f"127.0.0.1:{server.port}", f"localhost:{server.port}", "trusted.example"):
        assert request(server, "POST", path, body, {"Host": host,
                                                    "Content-Type": json_type})[0] == 200, host
    assert request(server, "POST", path, body, {"Origin": "http://evil.example",
                                                "Content-Type": "text/plain"})[0] == 403
    with pytest.raises(InvalidStatus) as refused:
        ws(server, origin="http://evil.example")
    assert refused.value.response.status_code == 403
    for origin in ("http://trusted.example", f"http://localhost:{server.port}"):
        with ws(server, origin=origin) as s:
            assert call(s, "reset", {"seed": 2})["data"]["observation"]["text"] == "seed 2"


@pytest.mark.slow
@pytest.mark.needs_export_venv
def test_5_reset_arguments_are_checked_with_one_clear_error(server):
    """A seed "5" would play another episode than 5 while the state said 5; -1 the episode of 1.
    Each wrong seed or episode_id gets one error frame saying why, and the session goes on."""
    with ws(server) as s:
        for seed in ("5", -1, True, 2**31, 1.5):
            err = call(s, "reset", {"seed": seed})
            assert err["type"] == "error" and "an int in [0, 2147483647]" in err["data"]["message"]
        err = call(s, "reset", {"seed": 1, "episode_id": "x" * 201})
        assert "episode_id" in err["data"]["message"]
        assert call(s, "reset", {"seed": 5})["data"]["observation"]["text"] == "seed 5"
        assert call(s, "state")["data"]["seed"] == 5


@pytest.mark.slow
@pytest.mark.needs_export_venv
def test_6_the_server_says_its_sandbox_level_and_can_demand_the_full_one(server, package):
    """The level is printed at start; --require_full serves only at sandbox.FULL; and the server
    refuses to start under ENABLE_WEB_INTERFACE (openenv's web interface shares one environment
    among all its clients)."""
    with sandbox.Sandbox(workers=1, pool=0, numpy=False) as sb:
        level = sb.level
    assert f"[{PKG}] sandbox level {level.split('+')[0]}" in server.log.read_text()
    full, _, full_log = start(package, server.cwd, "--require_full")
    web, _, web_log = start(package, server.cwd, env={"ENABLE_WEB_INTERFACE": "true"})
    try:
        assert web.wait(120) != 0 and "unset it" in web_log.read_text()
        if level.startswith("full"):
            assert healthy(f"http://127.0.0.1:{_port(full)}", full), full_log.read_text()
            assert "sandbox level full" in full_log.read_text()
        else:
            assert full.wait(120) != 0 and "require_full" in full_log.read_text()
    finally:
        stop(full)


def _port(proc) -> int:
    return int(proc.args[proc.args.index("--port") + 1])


@pytest.mark.slow
@pytest.mark.needs_export_venv
@pytest.mark.needs_root
def test_7_each_worker_has_its_own_scratch(server):
    """Two sessions each write 3 MiB into scratch, 4 MiB each (--scratch_mb 4): both succeed, where
    one tmpfs shared by every worker would have stopped the second (ENOSPC)."""
    if "mountns" not in server.log.read_text().split("sandbox level", 1)[1].split(";")[0]:
        pytest.skip("scratch tmpfs need root (mountns) and are not available here")
    with ws(server) as a, ws(server) as b:
        for s in (a, b):
            call(s, "reset", {"seed": 0})
        texts = [call(s, "step", {"message": "fill3"})["data"]["observation"]["text"]
                 for s in (a, b)]
    assert texts == ["filled 3", "filled 3"]


BAD_RUN = {"model": 'x"""\nopen(MARKER, "w").write("ran")\n"""', "setting": "games"}
PLAIN = "class PlainEnv:\n    def reset(self, seed=None):\n        return 'go', {}\n" \
        "    def step(self, action):\n        return 'done', 1.0, True, False, {}\n"


def test_7_generated_code_stays_data(tmp_path):
    """A crafted run directory: config.json's model closes the package docstring and writes a
    file; one environment renames its class at run time (the worker reports __name__), one env id
    climbs out of envs/. The package's __init__.py keeps the model inside its docstring, and
    both environments are left out, for their reasons."""
    marker = tmp_path / "ran"
    run = tmp_path / "run"
    pool = run / "envs" / "step-0000-rank-0"
    pool.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps(
        dict(BAD_RUN, model=BAD_RUN["model"].replace("MARKER", repr(str(marker))))))
    renamed = PLAIN + "PlainEnv.__name__ = 'Evil\"\\n\\x1bEnv'\n"
    entries = [("s0-r0-e0", PLAIN), ("s0-r0-e1", renamed), ("../../s0-r0-e2", PLAIN)]
    (pool / "pool.json").write_text(json.dumps([{"env_id": i, "origin": "designer", "skill": "s",
                                                 "returns": [1.0]} for i, _ in entries]))
    for i, source in entries:
        (pool / f"{i}.py").write_text(source)
    for fmt in ("openenv", "gem"):
        m = export.export(run, fmt, tmp_path / fmt, f"crafted_{fmt}")
        assert [e["env_id"] for e in m["envs"]] == ["s0-r0-e0"]
        reasons = {x["env_id"]: x["reason"] for x in m["excluded"]}
        assert "not a plain identifier" in reasons["s0-r0-e1"]
        assert "not a plain name" in reasons["../../s0-r0-e2"]
        tree = ast.parse((tmp_path / fmt / f"crafted_{fmt}" / "__init__.py").read_text())
        assert BAD_RUN["model"].replace("MARKER", repr(str(marker))) in ast.get_docstring(tree)
        kinds = {type(node).__name__ for node in tree.body[1:]}
        assert kinds <= {"ImportFrom", "Assign", "Expr"}, kinds   # the registrations, no more
        calls = [n.value.func.id for n in tree.body[1:] if isinstance(n, ast.Expr)]
        assert set(calls) <= {"register"}
    assert not marker.exists() and not (tmp_path / "s0-r0-e2.py").exists()


# ----------------------------------------------------------------------------------------------
# The trainer's client, items 8-13: hostile servers

SCHEMA = json.dumps({"action": {"properties": {"message": {"type": "string"}}}}).encode()


def observation(text, reward=None, done=False, **fields) -> str:
    return json.dumps({"type": "observation", "data": {
        "observation": {"text": text, "truncated": False, **fields}, "reward": reward,
        "done": done}})


def coin(message: dict, state: dict) -> list:
    """An honest two-call game: reset, then one call that wins on heads."""
    kind = message.get("type")
    if kind == "state":
        return [json.dumps({"type": "state", "data": {"step_count": 0}})]
    if kind == "reset":
        return [observation(f"Call it: heads or tails (seed {message['data'].get('seed')})")]
    if kind == "step":
        return [observation("Game over.", float("heads" in message["data"]["message"]), True)]
    return []


class Hostile:
    """An OpenEnv server on a loopback address that misbehaves as told. GET /schema gets
    `schema` (bytes, or a callable(sock) that writes its own response); a WebSocket upgrade gets
    `upgrade(protocol, request)`'s response (default: accepted), then a CAPACITY_REACHED frame
    when `capacity` sessions are open, else each text message gets answer(message, state)'s
    frames after `delay` seconds. It records the paths asked for and the most sessions open and
    messages in flight at once."""

    def __init__(self, answer=coin, host="127.0.0.1", schema=SCHEMA, upgrade=None,
                 capacity=None, delay=0.0):
        self.answer, self.schema, self.upgrade = answer, schema, upgrade
        self.capacity, self.delay, self.seen = capacity, delay, []
        self.open = self.in_flight = self.most_open = self.most_in_flight = 0
        self.lock, self.listener = threading.Lock(), socket.create_server((host, 0))
        self.url = f"http://{host}:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        with contextlib.suppress(OSError):
            while True:
                conn, _ = self.listener.accept()
                threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def close(self):
        self.listener.close()

    def _serve(self, conn):
        with conn, contextlib.suppress(OSError):
            data = b""
            while b"\r\n\r\n" not in data:
                if not (chunk := conn.recv(1 << 16)):
                    return
                data += chunk
            self.seen.append(data.split(b" ", 2)[1].decode())
            if b"upgrade: websocket" not in data.lower():
                if callable(self.schema):
                    return self.schema(conn)
                return conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                    b"Content-Length: %d\r\n\r\n%s" % (len(self.schema), self.schema))
            self._websocket(conn, data)

    def _websocket(self, conn, data):
        proto = ServerProtocol(max_size=None)
        proto.receive_data(data)
        request = proto.events_received()[0]
        response = (self.upgrade or (lambda p, r: p.accept(r)))(proto, request)
        proto.send_response(response)
        conn.sendall(b"".join(proto.data_to_send()))
        if response.status_code != 101:
            return
        with self.lock:
            full = self.capacity is not None and self.open >= self.capacity
            self.open += not full
            self.most_open = max(self.most_open, self.open)
        try:
            if full:
                proto.send_text(json.dumps({"type": "error", "data": {
                    "message": f"Server at capacity: {self.capacity}/{self.capacity} sessions",
                    "code": "CAPACITY_REACHED", "max_sessions": self.capacity}}).encode())
                proto.send_close(1000)
                conn.sendall(b"".join(proto.data_to_send()))
                conn.settimeout(5.0)  # the closing handshake: unread bytes would reset the socket
                return self._messages(conn, proto, answer=False)
            self._messages(conn, proto)
        finally:
            with self.lock:
                self.open -= not full

    def _messages(self, conn, proto, answer: bool = True):
        state = {}
        while (chunk := conn.recv(1 << 16)):
            proto.receive_data(chunk)
            for frame in proto.events_received():
                if frame.opcode is Opcode.TEXT and answer:
                    with self.lock:
                        self.in_flight += 1
                        self.most_in_flight = max(self.most_in_flight, self.in_flight)
                    time.sleep(self.delay)
                    with self.lock:
                        self.in_flight -= 1
                    for out in self.answer(json.loads(frame.data), state):
                        proto.send_text(out.encode() if isinstance(out, str) else out)
            conn.sendall(b"".join(proto.data_to_send()))
            if proto.close_expected():
                return


@pytest.fixture
def hostile():
    """hostile(**how) -> a started Hostile server; all are closed after the test."""
    servers = []

    def make(**how):
        servers.append(Hostile(**how))
        return servers[-1]
    yield make
    for s in servers:
        s.close()


def spec(server, fragment: str = "") -> str:
    return f"openenv:{server.url}{fragment}"


def test_8_frames_and_schema_are_bounded(hostile):
    """A 3 MiB observation and a 2 MiB schema are refused as they arrive (output_too_large),
    not read whole and cut afterwards."""
    huge = hostile(answer=lambda m, st: [observation("x" * (3 << 20))] if m["type"] == "step"
                   else coin(m, st))
    h = imported.handle(spec(huge))
    h.reset(seed=0)
    assert h.step("heads").fault == "output_too_large"
    fat = hostile(schema=SCHEMA[:-1] + b', "pad": "' + b"x" * (2 << 20) + b'"}')
    assert imported.handle(spec(fat)).reset(seed=0).fault == "output_too_large"


def test_9_one_deadline_per_call_and_per_episode(hostile, monkeypatch):
    """A /schema trickled a byte every 50 ms ends as a timeout at the call's deadline (1 s here),
    not at a per-read timeout; a server that answers each call in 0.3 s ends the episode at its
    budget (1 s here) with episode_timeout."""
    monkeypatch.setattr(openenv, "REMOTE_TIMEOUT", 1.0)
    monkeypatch.setattr(openenv, "REMOTE_EPISODE_TIMEOUT", 1.0)

    def trickle(conn):
        for b in b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(SCHEMA), SCHEMA):
            conn.sendall(bytes([b]))
            time.sleep(0.05)
    slow = hostile(schema=trickle)
    out, start = [], time.monotonic()
    t = threading.Thread(target=lambda: out.append(imported.handle(spec(slow)).reset(seed=0)),
                         daemon=True)
    t.start()
    t.join(6.0)
    assert out and out[0].fault == "timeout" and time.monotonic() - start < 3.0
    endless = hostile(delay=0.3, answer=lambda m, st: [observation("again", 0.0)]
                      if m["type"] == "step" else coin(m, st))
    h = imported.handle(spec(endless))
    h.reset(seed=0)
    kinds = [agent.fault(h.step("heads")) for _ in range(6)]
    assert "episode_timeout" in kinds and kinds.index("episode_timeout") <= 3, kinds


@pytest.mark.slow
def test_10_a_run_plays_every_episode_within_the_servers_capacity(hostile, tiny, tmp_path):
    """2 environments x 3 plays against a server of 2 sessions: train.py plays all 6 episodes (none
    a fault), never holds more than 2 sessions, and steps the 2 it holds at once."""
    server = hostile(capacity=2, delay=0.2)
    run = main_with({"agent": agent_engine(tiny)}, TINY + [
        "--steps", "1", "--num_envs", "2", "--plays", "3", "--output_dir", str(tmp_path / "r"),
        "--fixed_envs", f"{spec(server, '#index=0')},{spec(server, '#index=1')}"])
    (row,) = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert row["agent/episodes"] == 6 and row["env/faulty"] == 0, row
    assert server.most_open == 2 and server.most_in_flight == 2


def test_10_rounds_keep_each_episodes_sampling_key_and_never_drop_one(hostile, monkeypatch):
    """play_rounds: an episode of a later round submits its turns under the key of its place in
    the whole list (so its sampling seed does not depend on the rounds); a server whose every
    session is taken by others stops the run (ServerFull) instead of dropping episodes."""
    server = hostile(capacity=2)
    specs = [agent.EpisodeSpec("e", s, None, imported.handle(spec(server))) for s in range(5)]
    seen = []

    class Stream:
        pending = 0

        def submit(self, key, prompt, max_new_tokens=None):
            seen.append(key)

    def play(batch, generate):
        for j, s in enumerate(batch):
            assert s.handle.reset(s.seed)[0].endswith(f"(seed {s.seed})")
            generate.submit((j, 1), [0])
        return [s.seed for s in batch]
    assert openenv.play_rounds(specs, Stream(), play) == [0, 1, 2, 3, 4]
    assert sorted(seen) == [(i, 1) for i in range(5)] and server.most_open == 2
    monkeypatch.setattr(openenv, "BUSY_WAIT", 0.5)
    taken = hostile(capacity=0)
    with pytest.raises(openenv.ServerFull, match="refused every session"):
        openenv.play_rounds([agent.EpisodeSpec("e", 0, None, imported.handle(spec(taken)))],
                             None, play)


def test_11_local_means_local_no_redirect_no_proxy(hostile, monkeypatch):
    """127.0.0.2 is refused when named; a 302 to it (for /schema or for the WebSocket) does not
    take the client there, and http_proxy does not route a 127.0.0.1 URL through a proxy."""
    elsewhere = hostile(host="127.0.0.2")
    with pytest.raises(SystemExit, match="on this machine"):
        openenv.remote_url(spec(elsewhere))

    def moved(conn):
        conn.sendall(b"HTTP/1.1 302 Found\r\nLocation: %s/schema\r\nContent-Length: 0\r\n\r\n"
                     % elsewhere.url.encode())

    def moved_ws(proto, request):
        r = proto.reject(302, "moved")
        r.headers["Location"] = elsewhere.url.replace("http", "ws") + "/ws"
        return r
    for how in ({"schema": moved}, {"upgrade": moved_ws}):
        assert imported.handle(spec(hostile(**how))).reset(seed=0).fault == "reset_error"
    assert elsewhere.seen == []
    proxy = hostile()
    for name in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.setenv(name, proxy.url)
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    h = imported.handle(spec(hostile()))
    assert h.reset(seed=3)[0].endswith("(seed 3)") and h.step("heads")[1] == 1.0
    h.close()
    assert proxy.seen == []


@pytest.mark.parametrize("reply, kind", [
    ({"reward": "5"}, "invalid_reward"), ({"reward": True}, "invalid_reward"),
    ({"reward": " 1e1 "}, "invalid_reward"), ({"done": "false"}, "invalid_result"),
    ({"truncated": "no"}, "invalid_result"), ({"error": "\x1b[31mtimeout" + "x" * 5000},
                                              "protocol_violation"),
    ({"error": "timeout"}, "timeout"), ({"reward": 0}, None), ({"reward": None}, None)])
def test_12_replies_have_exact_types_and_fault_kinds_from_the_sandbox(hostile, reply, kind):
    """The sandbox's own checks (sandbox.check_step, FAULT_KINDS, FaultError): a reward is an
    int or float (null: none), done and truncated are bools, a fault kind not in FAULT_KINDS is a
    protocol_violation, and every message is short and printable."""
    obs = {k: v for k, v in reply.items() if k in ("truncated", "error")}
    top = {"reward": 0.0, "done": True, **{k: v for k, v in reply.items() if k in ("reward", "done")}}
    meta = {"metadata": {"message": "\x1b[2J" + "y" * 5000}} if "error" in reply else {}
    frame = json.dumps({"type": "observation", "data": {"observation": {
        "text": "t", "truncated": False, **obs, **meta}, **top}})
    h = imported.handle(spec(hostile(answer=lambda m, st: [frame] if m["type"] == "step"
                                     else coin(m, st))))
    h.reset(seed=0)
    result = h.step("heads")
    assert agent.fault(result) == kind
    if kind is None:
        assert result[1:4] == (0.0, True, False) and type(result[1]) is float
    else:
        assert len(result.message) <= 300 and result.message.isprintable()


def test_12_a_probe_prints_no_raw_server_text(hostile, capsys):
    """A server's fault kind and message reach the log shortened and printable."""
    bad = json.dumps({"type": "observation", "data": {"observation": {
        "text": "t", "error": "\x1b[31m" + "k" * (1 << 20), "metadata": {
            "message": "\x1b[0m" + "m" * 5000}}, "reward": 0.0, "done": True}})
    server = hostile(answer=lambda m, st: [bad] if m["type"] == "step" else coin(m, st))
    assert imported.probe(spec(server), "fixed") is None
    err = capsys.readouterr().err
    assert "protocol_violation" in err and "\x1b" not in err and len(err) < 500


def test_12_a_library_exception_cannot_name_its_fault():
    """In-process environments: only the client's own checks name a kind; an exception that
    carries a `kind` (empty, or a forged one) is a step_error all the same."""
    import gymnasium

    class Liar(gymnasium.Env):
        observation_space = action_space = gymnasium.spaces.Text(200)

        def reset(self, *, seed=None, options=None):
            return "go", {}

        def step(self, action):
            e = RuntimeError("boom")
            e.kind = "" if "a" in action else "nondeterministic"
            raise e
    if "SpadeTest/Liar-v0" not in gymnasium.registry:
        gymnasium.register("SpadeTest/Liar-v0", entry_point=Liar)
    for action in ("a", "b"):
        h = imported.handle("gymnasium:SpadeTest/Liar-v0")
        h.reset(seed=0)
        assert agent.fault(h.step(action)) == "step_error"


def test_13_the_client_keeps_its_rng_promise_and_reads_its_url_strictly(hostile):
    """No keepalive thread runs (websockets' pings draw from the global `random`), the client
    draws nothing from it, and the URL's fragment is read strictly: `index=02` or `²` is one
    clear error, a key twice too, and a `seed=` (which would play every episode alike) is refused."""
    random.seed(11)
    before = random.getstate()
    h = imported.handle(spec(hostile()))
    h.reset(seed=4)
    keepalive = [t for t in threading.enumerate()
                 if getattr(getattr(t, "_target", None), "__name__", "") == "keepalive"]
    assert keepalive == [] and h.step("tails")[1] == 0.0
    h.close()
    assert random.getstate() == before
    url = "openenv:http://127.0.0.1:8000"
    assert openenv.remote_url(url + "#index=0&name=x") == ("http://127.0.0.1:8000",
                                                           {"index": 0, "name": "x"})
    for frag, why in (("index=02", "ASCII digits"), ("index=\u00b2", "ASCII digits"),
                      ("seed=3", "each episode's seed"), ("index=1&index=1", "given twice")):
        with pytest.raises(SystemExit, match=why):
            openenv.remote_url(f"{url}#{frag}")
