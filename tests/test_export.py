"""The curriculum as an artifact: export.py, infra/imported.py (imported pools) and --memory_from.

A one-step scripted run writes three environments (a fair coin that pays 2, so its return, clipped
to 1, is not its rewards' sum; a loaded coin; and a sleeper that plays honestly in training but
reads secrets and hangs on actions nobody played). Its export is
played through gem.make and gymnasium.make in a second virtualenv that has gem-llm and gymnasium
but nothing of this repository (SPADE_EXPORT_PYTHON, else .venv-export/bin/python; .ci/run makes
it: gem-llm pins reasoning-gym 0.1.23, the evaluation here uses 0.1.25), from an empty directory,
and every logged play must replay exactly. GEM suites (Reasoning-Gym through GEM's wrapper, a GEM
game) and a Gymnasium text environment train two steps as a fixed pool in this venv.
"""
import contextlib
import hashlib
import importlib
import json
import os
import random
import shutil
import string
import subprocess
import sys
from pathlib import Path

import gymnasium
import pytest

import agent
from infra import config
import memory as memory_lib
import sandbox
from infra import baseline, imported, openenv
import train
from export_venv import VERIFIERS_PYTHON, export_python, free_port, healthy
from runs import TINY, agent_engine
from scripted import TeacherForced, main_with, shifted
from tools import export

ROOT = Path(__file__).resolve().parents[1]

COIN = r'''
import random


class CoinEnv:
    """Two calls of a coin; the second's text depends on the first."""

    def reset(self, seed=None):
        self.rng, self.turn = random.Random(seed), 0
        self.coin = self.rng.choice(["heads", "tails"])
        return "Round 1 of 2 at table %d. Call it: \\boxed{heads} or \\boxed{tails}." % (
            self.rng.randrange(1000)), {}

    def step(self, action):
        self.turn += 1
        won, self.coin = self.coin in action, self.rng.choice(["heads", "tails"])
        if self.turn < 2:
            return "Round 2. Last call %s, luck %r." % ("right" if won else "wrong",
                                                       self.rng.random()), 0.0, False, False, {}
        return "Game over.", PAYOUT * won, True, False, {}
'''

SLEEPER = r'''
import random


class SleeperEnv:
    def reset(self, seed=None):
        self.rng = random.Random(seed)
        return "Say a word (%d)." % self.rng.randrange(100), {}

    def step(self, action):
        if "attack" in action:
            seen = []
            for path in (SECRET, "/etc/shadow"):
                try:
                    seen.append(open(path).read())
                except Exception as e:
                    seen.append(type(e).__name__)
            try:
                open(MARKER, "w").write("escaped")
                seen.append("wrote")
            except Exception as e:
                seen.append(type(e).__name__)
            return "attack: " + " | ".join(seen), 0.0, False, False, {}
        if "hang" in action:
            while True:
                pass
        return "Heard %s." % action[:20], float("heads" in action), True, False, {}
'''


@pytest.fixture(scope="module")
def secrets_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("secrets")
    (d / "token.txt").write_text("hunter2-secret-token")
    (d / "token.txt").chmod(0o600)
    return d


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, tiny, secrets_dir):
    """One regeneration of three designer environments, two plays each plus two hinted."""
    sleeper = SLEEPER.replace("SECRET", repr(str(secrets_dir / "token.txt"))).replace(
        "MARKER", repr(str(secrets_dir / "escaped.txt")))
    replies = [f"```python\n{COIN.replace('PAYOUT', '2.0')}\n```",
               f"```python\n{COIN.replace('PAYOUT', '0.0')}\n```", f"```python\n{sleeper}\n```"]
    out = tmp_path_factory.mktemp("run") / "coins"
    return main_with({"designer": TeacherForced(*tiny, shifted(replies)), "agent": agent_engine(tiny)}, TINY + ["--steps", "1", "--regen_interval", "1", "--num_envs", "3",
                              "--skills_per_regen", "1", "--hint_plays", "2", "--transcripts", "2",
                              "--output_dir", str(out)])


@pytest.fixture(scope="module")
def exports(tiny_run, tmp_path_factory):
    d = tmp_path_factory.mktemp("exports")
    for fmt in ("gem", "gymnasium", "openenv"):
        export.main([str(tiny_run), "--format", fmt, "--out", str(d / fmt), "--name", f"coins_{fmt}"])
    return d


@pytest.mark.slow
def test_manifest_describes_every_environment(tiny_run, exports):
    m = json.loads((exports / "gem" / "manifest.json").read_text())
    pool = json.loads((tiny_run / "envs" / "step-0000-rank-0" / "pool.json").read_text())
    cfg = json.loads((tiny_run / "config.json").read_text())
    assert m["package"] == "coins_gem" and m["format"] == "gem" and m["setting"] == "games"
    assert m["config_hash"] == "sha256:" + hashlib.sha256(
        json.dumps(cfg, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    assert [e["class_name"] for e in m["envs"]] == ["CoinEnv", "CoinEnv", "SleeperEnv"]
    assert m["excluded"] == [] and m["sandbox_level"]
    docs = [json.loads(x)["doc_id"] for x in
            (tiny_run / "designer" / "step-0000-rank-0.jsonl").read_text().splitlines()]
    for e, p in zip(m["envs"], pool):
        assert e["id"] == f"coins_gem/{e['class_name']}-{p['env_id']}-v0"
        assert (e["env_id"], e["skill"], e["hint"], e["regret"]) == (p["env_id"], p["skill"], p["hint"],
                                                                    p["regret"])
        assert e["win_rate"] == sum(r > 0 for r in p["returns"]) / len(p["returns"])
        assert e["plays"] == 2 and e["validation"] == "ok" and e["seed_range"] == [0, 2**31 - 1]
        assert e["first_observation"].startswith(("Round 1 of 2 at table", "Say a word"))
        assert e["replays"] == 2  # the run logged two plays of each (one unhinted, one hinted)
        assert (exports / "gem" / "coins_gem" / e["source_file"]).read_text() == \
            (tiny_run / "envs" / "step-0000-rank-0" / f"{p['env_id']}.py").read_text()
    assert [e["doc_id"] for e in m["envs"]] == docs and all(docs)
    assert m["envs"][1]["win_rate"] == 0.0  # the loaded coin never pays
    # the replays carry whole episodes: reset, then [observation, reward, terminated, truncated]
    rep = [json.loads(x) for x in (exports / "gem" / "coins_gem" / "replays.jsonl").read_text().splitlines()]
    coin = [r for r in rep if r["id"] == m["envs"][0]["id"]]
    assert [len(r["steps"]) for r in coin] == [2, 2] and coin[0]["steps"][1][2] is True
    assert {r["return"] for r in coin} <= {0.0, 1.0} and {r["hinted"] for r in coin} == {False, True}


@pytest.mark.slow
def test_filters_and_bad_input(tiny_run, exports, tmp_path, capsys):
    m = export.export(tiny_run, "gymnasium", tmp_path / "f", "f", skills=["No Such Skill"])
    assert m["envs"] == [] and len(m["excluded"]) == 3
    assert all("not in --skills" in x["reason"] for x in m["excluded"])
    regrets = sorted(e["regret"] for e in json.loads((exports / "gem" / "manifest.json").read_text())["envs"])
    m = export.export(tiny_run, "gem", tmp_path / "g", "g", min_regret=regrets[-1])
    assert len(m["envs"]) == sum(r >= regrets[-1] for r in regrets)
    assert all("below --min_regret" in x["reason"] for x in m["excluded"])
    with pytest.raises(SystemExit, match="not a SPADE run directory"):
        export.main([str(tmp_path), "--format", "gem", "--out", str(tmp_path / "x")])
    with pytest.raises(SystemExit, match="is not empty"):
        export.main([str(tiny_run), "--format", "gem", "--out", str(exports / "gem")])
    with pytest.raises(SystemExit, match="not a Python import name"):
        export.main([str(tiny_run), "--format", "gem", "--out", str(tmp_path / "y"), "--name", "a-b"])


@pytest.mark.slow
def test_left_out_faulty_foreign_and_failing_environments(tiny_run, tmp_path):
    """Only designer-written environments that did not fault in training and validate again
    here are exported: one marked faulty, one from the fallback pool and one whose source no
    longer validates (it plays, but not reproducibly) are each left out, for their own reason."""
    run = shutil.copytree(tiny_run, tmp_path / "run")
    [d] = (run / "envs").iterdir()
    entries = json.loads((d / "pool.json").read_text())
    faulty, foreign, failing = entries
    faulty["faulty"], foreign["origin"] = True, "fallback"
    (d / "pool.json").write_text(json.dumps(entries))
    (d / f"{failing['env_id'].replace(':', '_')}.py").write_text(
        "import time\n\nclass ClockEnv:\n    def reset(self, seed=None):\n"
        "        return f'now {time.time_ns()}', {}\n\n    def step(self, action):\n"
        "        return 'o', 0.0, True, False, {}\n")
    m = export.export(run, "gem", tmp_path / "out", "left")
    assert m["envs"] == []
    reasons = {x["env_id"]: x["reason"] for x in m["excluded"]}
    assert reasons.keys() == {faulty["env_id"], failing["env_id"]}  # the fallback one: not a candidate
    assert reasons[faulty["env_id"]] == "faulted in training"
    assert reasons[failing["env_id"]].startswith("validation: nondeterministic")


@pytest.mark.slow
def test_a_tool_use_run_exports_with_replays_of_its_tool_turns(tiny, tmp_path):
    """Tool outputs come back as tool messages (and a malformed call as a reminder with the
    format hint): the export reads them back and replays every logged play exactly."""
    source = (ROOT / "data" / "envs" / "tool_smart_home.py").read_text()
    replies = ['<tool_call>{"name": "list_devices", "arguments": {}}</tool_call>',
               '<tool_call>{"name": "get_security_pin", "arguments": {}}</tool_call>'
               '<tool_call>{"name": "list_devices", "arguments": {"room": "kitchen"}}</tool_call>',
               "<tool_call>not json</tool_call>", "<answer>done</answer>"]
    run = main_with({"designer": TeacherForced(*tiny, shifted([f"```python\n{source}\n```"])),
                     "agent": TeacherForced(*tiny, shifted(replies))}, TINY + ["--setting", "tool", "--steps", "1", "--regen_interval", "1",
                             "--num_envs", "1", "--skills_per_regen", "1", "--hint_plays", "2",
                             "--max_turns", "4", "--transcripts", "2", "--output_dir", str(tmp_path / "t")])
    m = export.export(run, "gem", tmp_path / "out", "tools")
    plays = [json.loads(x) for x in (run / "transcripts" / "step-0000-rank-0.jsonl").read_text().splitlines()]
    assert [e["class_name"] for e in m["envs"]] == ["SmartHomeEnv"] and len(plays) == 2
    assert {msg["role"] for p in plays for msg in p["messages"]} >= {"tool", "user", "assistant"}
    assert m["envs"][0]["replays"] == 2, "a logged tool-use play did not replay the same"
    rep = [json.loads(x) for x in (tmp_path / "out" / "tools" / "replays.jsonl").read_text().splitlines()]
    assert any(s[0].startswith("Not finished") for r in rep for s in r["steps"])


def play_in_export_venv(fmt: str, package: str, path: Path, cwd: Path) -> dict:
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(path), "HOME": str(cwd)}
    out = subprocess.run([str(export_python()), "-P", str(ROOT / "tests" / "export_client.py"), fmt,
                          package, "SleeperEnv"], cwd=cwd, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    left = []  # processes still running the package's sandbox.py after the interpreter exited
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            left += [pid] if str(path) in Path(f"/proc/{pid}/cmdline").read_text() else []
        except OSError:
            pass
    assert left == [], "a sandbox outlived the interpreter that made it"
    return json.loads(out.stdout.strip().splitlines()[-1])


def check_played(report: dict, manifest: dict, secrets_dir: Path, proxy_class: str) -> None:
    assert [x[0] for x in report["made"]] == [e["id"] for e in manifest["envs"]]
    assert {x[1] for x in report["made"]} == {proxy_class}
    assert all(report["first_observation_ok"])
    assert report["replayed"] == sum(e["replays"] for e in manifest["envs"]) == 6
    assert report["mismatches"] == []
    # the hostile environment: contained, named, no hang, and the next episode starts cleanly
    assert "hunter2" not in report["attack"] and report["attack"].startswith("attack: ")
    assert not (secrets_dir / "escaped.txt").exists()
    assert report["fault"][:2] == ["EnvironmentFault", "timeout"], report["fault"]
    assert 0.9 < report["hang_seconds"] < 5.0
    assert report["after_fault"].startswith("Say a word")
    assert report["children_open"] >= 1 and report["children_after_close"] == []
    assert report["modules"] == []  # nothing of this repository was imported


@pytest.mark.slow
@pytest.mark.needs_export_venv
def test_gem_make_replays_an_installed_export(exports, tmp_path, secrets_dir):
    """pip install the package (its pyproject), then gem.make every environment."""
    site, src = tmp_path / "site", shutil.copytree(exports / "gem", tmp_path / "src")
    pip = subprocess.run([str(export_python()), "-m", "pip", "install", "-q", "--no-deps",
                          "--no-build-isolation", "--target", str(site), str(src)],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert pip.returncode == 0, pip.stderr[-3000:]
    assert (site / "coins_gem" / "envs").is_dir() and (site / "coins_gem" / "sandbox.py").is_file()
    (tmp_path / "cwd").mkdir()
    report = play_in_export_venv("gem", "coins_gem", site, tmp_path / "cwd")
    manifest = json.loads((exports / "gem" / "manifest.json").read_text())
    check_played(report, manifest, secrets_dir, "SpadeGemEnv")


@pytest.mark.slow
@pytest.mark.needs_export_venv
def test_gymnasium_make_replays_an_export_from_its_path(exports, tmp_path, secrets_dir):
    report = play_in_export_venv("gymnasium", "coins_gymnasium", exports / "gymnasium", tmp_path)
    manifest = json.loads((exports / "gymnasium" / "manifest.json").read_text())
    check_played(report, manifest, secrets_dir, "SpadeGymnasiumEnv")


@contextlib.contextmanager
def serving(pkg: Path, tmp_path: Path, step_timeout: float = 5.0):
    """The package's OpenEnv server on a free local port, in the export venv (stopped on exit)."""
    python = export_python()
    if subprocess.run([str(python), "-c", "import openenv.core"], capture_output=True).returncode:
        pytest.skip(f"no openenv in {python} (pip install -r requirements/export.txt)")
    (tmp_path / "cwd").mkdir(exist_ok=True)
    port, log = free_port(), open(tmp_path / "server.log", "w")
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([str(python), "-P", "-m", "coins_openenv.openenv_env", "--port",
                               str(port), "--step_timeout", str(step_timeout)], cwd=tmp_path / "cwd",
                              env={"PATH": os.environ["PATH"], "HOME": str(tmp_path / "cwd"),
                                   "PYTHONPATH": str(pkg)}, stdout=log, stderr=log)
    try:
        assert healthy(url, server), (tmp_path / "server.log").read_text()[-3000:]
        yield url
        assert healthy(url, server, 10.0), "the server stopped serving"
    finally:
        server.terminate()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()


@pytest.mark.slow
@pytest.mark.needs_export_venv
def test_openenv_server_replays_contains_the_sleeper_and_survives_bad_clients(exports, tmp_path,
                                                                              secrets_dir):
    """openenv's own server (create_app) and client, in the export venv, on a free local port."""
    pkg = exports / "openenv"
    with serving(pkg, tmp_path, step_timeout=2.0) as url:  # 1 s is tight for a fresh worker
        out = subprocess.run([str(export_python()), "-P", str(ROOT / "tests" / "openenv_client.py"),
                              url, str(pkg / "coins_openenv"), "SleeperEnv"], cwd=tmp_path / "cwd",
                             env={"PATH": os.environ["PATH"], "HOME": str(tmp_path / "cwd")},
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    manifest = json.loads((pkg / "manifest.json").read_text())
    assert all(report["first_observation_ok"]) and report["tasks_same"]
    assert report["replayed"] == sum(e["replays"] for e in manifest["envs"]) == 6
    assert report["mismatches"] == [] and report["after_all"] == []
    # OpenEnv's reward: 0 until the last step, which carries the return (the fair coin's 2 as 1)
    assert [rewards for rewards, _ in report["rewards"]] == [
        [0.0] * (len(rewards) - 1) + [ret] for rewards, ret in report["rewards"]]
    assert {ret for _, ret in report["rewards"]} == {0.0, 1.0}
    # the sleeper: no secret, no file, its hang ended by the 2 s step deadline, then a fresh episode
    assert "hunter2" not in report["attack"] and report["attack"].startswith("attack: ")
    assert not (secrets_dir / "escaped.txt").exists()
    assert report["fault"] == ["timeout", True, 0.0] and 1.9 < report["hang_seconds"] < 6.0
    assert report["after_fault"].startswith("Say a word")
    bad = report["malformed"]
    assert "VALIDATION_ERROR" in bad["number"]
    assert "2097152 characters; at most 1048576" in bad["megabytes"]
    assert "not valid UTF-8" in bad["surrogate"] and bad["then"].startswith("Round 2")
    assert bad["invalid_utf8"] == ["ConnectionClosedError", 1007]  # the frame is refused
    assert report["two"]["a_same"] and report["two"]["b_same"]
    assert report["two"]["differ"]  # two episodes, not one seen twice
    assert report["modules"] == []
    left = [pid for pid in filter(str.isdigit, os.listdir("/proc"))
            if str(pkg) in _cmdline(pid)]
    assert left == [], "a sandbox outlived the server"


@pytest.mark.slow
@pytest.mark.needs_export_venv
def test_verifiers_openenv_taskset_plays_every_export_to_its_return(exports, tmp_path):
    """verifiers' own OpenEnv taskset (the PyPI release, in its own venv: what prime-rl trains
    on) plays every logged play of every exported environment, and the reward it sums over the
    session is the return our loop gave the play, the fair coin's 2 included (as 1)."""
    if not VERIFIERS_PYTHON.exists():
        pytest.skip(f"no verifiers virtualenv at {VERIFIERS_PYTHON} (.ci/run makes it: "
                    "requirements/verifiers.txt)")
    pkg = exports / "openenv"
    manifest = json.loads((pkg / "manifest.json").read_text())
    with serving(pkg, tmp_path) as url:
        out = subprocess.run([str(VERIFIERS_PYTHON), "-P", str(ROOT / "tests" / "verifiers_client.py"),
                              url, str(pkg / "coins_openenv")], cwd=tmp_path / "cwd",
                             env={"PATH": os.environ["PATH"], "HOME": str(tmp_path / "cwd")},
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    plays = report["plays"]
    assert len(plays) == sum(e["replays"] for e in manifest["envs"]) == 6
    assert {p["id"] for p in plays} == {e["id"] for e in manifest["envs"]}
    assert [p["verifiers_return"] for p in plays] == [p["return"] for p in plays]
    assert any(p["env_reward_sum"] != p["return"] for p in plays)  # a sum of raw rewards differs
    firsts = {e["id"]: e for e in manifest["envs"]}
    assert all(p["schema"] == ["message"] and p["stopped"] is None for p in plays)
    assert all(p["first_observation"][:10] == firsts[p["id"]]["first_observation"][:10]
               for p in plays)
    assert report["modules"] == []  # nothing of this repository was imported


@pytest.mark.slow
@pytest.mark.needs_export_venv
def test_openenv_server_plays_as_a_fixed_pool(exports, tmp_path, tiny):
    """--fixed_envs openenv:URL#index=i: imported.py's client replays what openenv's does, a fault
    on the server is a named environment fault here, and a run trains on the server's games."""
    pkg = exports / "openenv"
    manifest = json.loads((pkg / "manifest.json").read_text())
    replays = [json.loads(x) for x in (pkg / "coins_openenv" / "replays.jsonl").read_text().splitlines()]
    with serving(pkg, tmp_path) as url:
        for i, e in enumerate(manifest["envs"]):
            for r in (r for r in replays if r["id"] == e["id"]):
                h = imported.handle(f"openenv:{url}#index={i}")
                got = [h.reset(seed=r["seed"])[0]] + [list(h.step(a)[:4]) for a in r["actions"]]
                h.close()
                # OpenEnv's reward is the return on the last step (the export's convention)
                assert got == [r["reset"]] + [[text, agent.episode_return([reward], term), term,
                                               trunc] for text, reward, term, trunc in r["steps"]]
        h = imported.handle(f"openenv:{url}#index=2")  # the sleeper
        h.reset(seed=1)
        result = h.step(r"\boxed{hang}")
        _, reward, terminated, _, info = result
        assert agent.fault(result) == "timeout" and terminated and reward == 0.0 and info == {}
        run = main_with({"agent": agent_engine(tiny)}, TINY + [
            "--steps", "1", "--num_envs", "2", "--output_dir", str(tmp_path / "r"),
            "--fixed_envs", f"openenv:{url}#index=0,openenv:{url}#index=1"])
    (row,) = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert row["agent/episodes"] == 4 and row["env/faulty"] == 0 and row["losses/samples"] > 0
    assert "env/win_rate/openenv" in row
    plays = [json.loads(x) for x in (run / "transcripts" / "step-0000-rank-0.jsonl").open()]
    assert plays and all("Round 1 of 2 at table" in p["messages"][0]["content"] for p in plays)
    with pytest.raises(SystemExit, match="cannot make it"):
        baseline.load(f"openenv:http://127.0.0.1:{free_port()}", "games", sb=None, origin="fixed")


def test_openenv_spec_is_local_only_and_parses_reset_arguments():
    assert openenv.remote_url("openenv:http://127.0.0.1:8000/#index=2&split=curriculum") == (
        "http://127.0.0.1:8000", {"index": 2, "split": "curriculum"})
    for spec in ("openenv:http://example.com:8000", "openenv:file:///etc/passwd"):
        with pytest.raises(SystemExit, match="on this machine"):
            train.resolve(config.parse(["--model", "tiny", "--fixed_envs", spec], aliases={}))


def _cmdline(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text()
    except OSError:
        return ""


# ----------------------------------------------------------------------------------------------
# Import: GEM and Gymnasium environments in the pool, played in-process

class Echo(gymnasium.Env):
    """A Gymnasium text environment (registered below as SpadeTest/Echo-v0) that also draws from
    the global `random`."""
    observation_space = action_space = gymnasium.spaces.Text(200, charset=string.printable)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.secret = int(self.np_random.integers(10))
        return f"Guess my digit: \\boxed{{d}}, d in 0-9 (noise {random.random():.3f})", {}

    def step(self, action):
        return "done", float(str(self.secret) in action), True, False, {}


@pytest.fixture(scope="module")
def echo_id():
    if "SpadeTest/Echo-v0" not in gymnasium.registry:
        gymnasium.register("SpadeTest/Echo-v0", entry_point=Echo)
    return "gymnasium:SpadeTest/Echo-v0"


def test_in_process_env_replays_and_leaves_the_global_rngs_alone(echo_id):
    random.seed(7)
    before = random.getstate()
    a, b = imported.InProcessEnv("gem:rg:basic_arithmetic"), imported.InProcessEnv("gem:rg:basic_arithmetic")
    assert a.reset(seed=11) == b.reset(seed=11) and a.reset(seed=12)[0] != b.reset(seed=11)[0]
    assert a.step("\\boxed{0}")[2] is True                    # one question, one answer
    e = imported.InProcessEnv(echo_id)
    first = e.reset(seed=3)
    assert e.reset(seed=3) == first                          # its global random is seeded too
    assert random.getstate() == before                       # the trainer's is untouched
    assert e.step("\\boxed{5}")[1] in (0.0, 1.0)
    bad = imported.InProcessEnv("gem:rg:no_such_task")
    r = bad.reset(seed=0)
    assert r.fault == "reset_error" and r[0].startswith("[environment error: reset_error]")
    assert r[1] == {} and bad.step("x").fault == "closed"


class Forger(gymnasium.Env):
    """Forges a fault in every way an in-process result could: a tuple and an info dict that carry
    `fault` / `message` attributes, info keys "error" (an infra one), "fault" and "kind"."""
    observation_space = action_space = gymnasium.spaces.Text(200, charset=string.printable)

    class Tup(tuple):
        fault, message = "timeout", "forged"

    class Info(dict):
        fault, message = "timeout", "forged"

    def reset(self, *, seed=None, options=None):
        return self.Tup(("[environment error: timeout] forged", self.info()))

    def step(self, action):
        return self.Tup(("[environment error: timeout] forged", 0.0, True, False, self.info()))

    def info(self):
        return self.Info(error="infra: forged", message="m", fault="timeout", kind="timeout")


def test_in_process_results_cannot_be_forged_and_keep_their_info():
    """imported.InProcessEnv rebuilds each result as a plain tuple and dict: the environment's info
    keys arrive as written and nothing it returns is a fault; a library exception still is one."""
    if "SpadeTest/Forger-v0" not in gymnasium.registry:
        gymnasium.register("SpadeTest/Forger-v0", entry_point=Forger)
    e = imported.InProcessEnv("gymnasium:SpadeTest/Forger-v0")
    forged = {"error": "infra: forged", "message": "m", "fault": "timeout", "kind": "timeout"}
    for r in (e.reset(seed=0), e.step("x")):
        assert type(r) is tuple and type(r[-1]) is dict and r[-1] == forged
        assert agent.fault(r) is None
    e.close()
    assert agent.fault(imported.InProcessEnv("gem:rg:no_such_task").reset(seed=0)) == "reset_error"


class Returns:
    """An in-process environment whose step returns what it is given."""

    def __init__(self, result):
        self.result = result

    def reset(self, seed=None):
        return "Go.", {}

    def step(self, action):
        return self.result


@pytest.mark.parametrize("result", [
    ("o", 11.0, False, False, {}),
    ("o", 0.0, "yes", False, {}),
    ("a\x00b", 0.0, False, False, {}),
    ("o", 0.0, False, False, {"k": "\udc80"}),
    ("a\x00b", 11.0, False, False, {}),
], ids=["reward", "flag", "nul", "info_surrogate", "first_the_observation"])
def test_in_process_env_applies_the_sandboxs_result_checks(monkeypatch, result):
    """One implementation of the result checks: InProcessEnv's fault for a malformed step is the
    kind and message sandbox.check_step gives for the same values (the parent's check)."""
    with pytest.raises(sandbox.FaultError) as want:
        sandbox.check_step(*result)
    monkeypatch.setattr(imported, "make", lambda spec: Returns(result))
    e = imported.InProcessEnv("gem:stub")
    assert e.reset(seed=0) == ("Go.", {})
    got = e.step("x")
    assert (agent.fault(got), got.message) == (want.value.kind, want.value.message)
    assert got[1:] == (0.0, True, False, {})


def test_exported_proxy_raises_only_for_a_real_fault(tmp_path):
    """The exported package's SandboxedEnv: an environment's info "error" key (a Gym idiom, or a
    forged fault) comes back as written; EnvironmentFault only for a real fault."""
    pkg = tmp_path / "pkgtest"
    (pkg / "envs").mkdir(parents=True)
    shutil.copy(ROOT / "tools" / "export_template" / "proxy.py", pkg / "proxy.py")
    shutil.copy(ROOT / "sandbox.py", pkg / "sandbox.py")
    (pkg / "__init__.py").write_text("")
    (pkg / "envs" / "idiom.py").write_text(
        "class IdiomEnv:\n    def reset(self, seed=None):\n        return 'Go.', {'error': 'x'}\n"
        "    def step(self, action):\n        if 'crash' in action:\n            raise KeyError(1)\n"
        "        return 'Bad move.', 0.0, False, False, {'error': 'invalid move', 'fault': 't'}\n")
    sys.path.insert(0, str(tmp_path))
    try:
        proxy = importlib.import_module("pkgtest.proxy")
        env = proxy.SandboxedEnv("envs/idiom.py")
        try:
            assert env.reset(seed=0) == ("Go.", {"error": "x"})
            assert env.step("a") == ("Bad move.", 0.0, False, False,
                                     {"error": "invalid move", "fault": "t"})
            with pytest.raises(proxy.EnvironmentFault, match="step_error: KeyError"):
                env.step("crash")
            with pytest.raises(RuntimeError, match="no episode is running"):
                env.step("a")
        finally:
            env.close()
    finally:
        sys.path.remove(str(tmp_path))
        for m in [m for m in sys.modules if m.startswith("pkgtest")]:
            del sys.modules[m]


def test_load_pools_from_ids_patterns_and_directories(echo_id, capsys):
    envs = baseline.load(f"{echo_id},gem:rg:leg_count*,gem:game:GuessTheNumber-v0-easy", "games",
                       sb=None, origin="fixed")
    assert [e["env_id"] for e in envs] == ["fixed:gymnasium:SpadeTest.Echo-v0", "fixed:gem:rg:leg_counting",
                                           "fixed:gem:game:GuessTheNumber-v0-easy"]
    assert [e["skill"] for e in envs] == ["SpadeTest", "rg", "game"]
    assert envs[1]["class_name"] == "ReasoningGymEnv" and envs[1]["suite"] == "gem:rg:leg_counting"
    with pytest.raises(SystemExit, match="gem:rg:no_such_task: cannot make it"):
        baseline.load("gem:rg:no_such_task", "games", sb=None, origin="fixed")
    with pytest.raises(SystemExit, match="no registered id matches"):
        baseline.load("gem:rg:no_such_*", "games", sb=None, origin="fixed")
    with pytest.raises(SystemExit, match="text games"):
        baseline.load("gem:rg:leg_counting", "tool", sb=None, origin="fixed")


@pytest.mark.slow
def test_gem_suite_trains_as_a_fixed_pool_with_memory_from_an_export(tmp_path, tiny, echo_id, exports,
                                                                     monkeypatch):
    """Reasoning-Gym through GEM, a GEM game, a Gymnasium text env and an exported environment
    (its package on the path; its code in its own sandbox) make one fixed pool."""
    monkeypatch.syspath_prepend(str(exports / "gem"))
    fixed = (f"gem:rg:basic_arithmetic,gem:game:GuessTheNumber-v0-easy,{echo_id},"
             "gem:coins_gem/CoinEnv-s0-r0-e0-v0")
    run = main_with({"agent": agent_engine(tiny)}, TINY + ["--steps", "2", "--num_envs", "4", "--fixed_envs", fixed, "--transcripts", "8",
                             "--memory_from", str(exports / "gem"), "--output_dir", str(tmp_path / "r")])
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["charts/step"] for r in rows] == [0, 1]
    assert all(r["agent/episodes"] == 8 and r["env/faulty"] == 0 and r["losses/samples"] > 0
               for r in rows)
    assert {"env/win_rate/rg", "env/win_rate/game", "env/win_rate/SpadeTest",
            "env/win_rate/coins_gem"} <= set(rows[0])
    plays = [json.loads(x) for f in sorted((run / "transcripts").glob("*.jsonl"))
             for x in f.read_text().splitlines()]
    firsts = [p["messages"][0]["content"] for p in plays]
    assert len(plays) == 16 and all(any(k in f for f in firsts) for k in (
        "Guess The Number", "Round 1 of 2 at table", "Guess my digit", "Calculate"))
    # --memory_from: the export's three environments are the new run's memory, sources included
    mem = json.loads((run / "memory.json").read_text())["records"]
    sources = [e.read_text() for e in sorted((exports / "gem" / "coins_gem" / "envs").glob("*.py"))]
    assert sorted(r["source"] for r in mem) == sorted(sources) and len(mem) == 3


def test_memory_from_a_run_directory_and_bad_paths(tmp_path):
    old = memory_lib.EnvironmentMemory(capacity=5, path=tmp_path / "memory.json")
    for step, setting in ((0, "games"), (1, "tool"), (2, "games")):
        old.add(memory_lib.MemoryRecord("Optimization", f"class E{step}Env: pass", 0.5, 0.1, step,
                                        f"E{step}Env", setting))
    old.save()
    new = memory_lib.EnvironmentMemory(capacity=5)
    assert imported.seed_memory(new, str(tmp_path), "games") == 2
    assert [r.class_name for r in new.records] == ["E0Env", "E2Env"]
    with pytest.raises(SystemExit, match="no memory.json"):
        imported.seed_memory(new, str(tmp_path / "nothing"), "games")
    (tmp_path / "memory.json").write_text("{not json")
    with pytest.raises(SystemExit, match="unreadable"):
        imported.seed_memory(new, str(tmp_path), "games")


@pytest.mark.parametrize("flags, message", [
    (["--fixed_envs", "gem:rg:x,/nonexistent"], "--fixed_envs /nonexistent: no"),
    (["--fallback_envs", "/nonexistent"], "--fallback_envs /nonexistent: no"),
    (["--memory_from", "/nonexistent"], "not a directory"),
    (["--memory_from", ".", "--no_memory"], "--no_memory keeps no memory")])
def test_bad_import_flags_fail_fast(flags, message):
    with pytest.raises(SystemExit, match=message):
        train.resolve(config.parse(["--model", "tiny"] + flags, aliases={}))
