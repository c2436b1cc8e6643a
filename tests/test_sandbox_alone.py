"""sandbox.py is a copyable leaf: alone it runs games and programs; with toolenv.py beside it, tool
environments. Each test copies the files into an empty directory and drives them from a fresh
interpreter whose only import path outside the standard library is that directory (`python -I`:
no site-packages, no PYTHON* variables, no script or working directory on sys.path).

Run: python -m pytest -q tests/test_sandbox_alone.py
"""
import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

GAME = textwrap.dedent(r"""
    import random

    class CoinEnv:
        def reset(self, seed=None):
            self.coin, self.t = random.Random(seed).choice("HT"), 0
            return "Heads or tails? Answer \\boxed{H} or \\boxed{T}.", {}
        def step(self, action):
            self.t += 1
            won = action.strip() == "\\boxed{%s}" % self.coin
            return ("Right." if won else "Wrong."), float(won), won or self.t >= 3, False, {}
""")

TOOL = textwrap.dedent("""
    class LampEnv(ToolEnv):
        TOOLS = [{"name": "switch", "description": "Turn a lamp on or off.",
                  "parameters": {"type": "object", "properties": {
                      "lamp": {"type": "string"}, "on": {"type": "boolean"}},
                      "required": ["lamp", "on"]}}]
        def setup(self, rng):
            self.lamps = rng.sample(["hall", "desk", "porch", "attic"], 3)
            self.state = {lamp: False for lamp in self.lamps}
            self.instructions = [(f"Turn on the {lamp} lamp.", lambda s, lamp=lamp: s[lamp])
                                 for lamp in self.lamps]
        def tool_switch(self, lamp, on):
            if lamp not in self.state:
                return "No such lamp."
            self.state[lamp] = bool(on)
            return f"{lamp}: {'on' if on else 'off'}"
        def solution(self):
            return [{"name": "switch", "arguments": {"lamp": lamp, "on": True}}
                    for lamp in self.lamps]
""")


def run_in(files: list[str], tmp_path: Path, body: str) -> dict:
    """Copy `files` from the repository into an empty directory and run `body` there under
    `python -I` (that directory first on sys.path); `body` prints one JSON line, returned."""
    for name in files:
        shutil.copy(ROOT / name, tmp_path / name)
    script = f"import sys\nsys.path.insert(0, {str(tmp_path)!r})\n" + textwrap.dedent(body)
    done = subprocess.run([sys.executable, "-I", "-c", script], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_sandbox_alone_validates_and_plays_games_and_runs_programs(tmp_path):
    out = run_in(["sandbox.py"], tmp_path, f"""
        import importlib.util, json, time
        import sandbox
        out = {{"file": sandbox.__file__, "toolenv_findable": bool(importlib.util.find_spec("toolenv"))}}
        with sandbox.Sandbox(workers=1, step_timeout=5.0, pool=1) as sb:
            out["level"] = sb.level
            out["valid"] = sb.validate({GAME!r}).ok
            env = sb.open({GAME!r})
            out["play"] = [env.reset(seed=3)[0], list(env.step("\\\\boxed{{H}}"))]
            env.close()
            out["program"] = sb.run_program("print(sum(map(int, input().split())))", "2 40")
            t0 = time.monotonic()
            try:
                sb.validate("class LampEnv(ToolEnv):\\n    pass\\n", setting="tool")
                out["tool"] = "no error"
            except sandbox.SandboxInfraError as e:
                out["tool"] = str(e)
            out["tool_s"] = time.monotonic() - t0
        print(json.dumps(out))
    """)
    assert out["file"] == str(tmp_path / "sandbox.py") and out["toolenv_findable"] is False
    assert out["valid"] is True, out
    won = __import__("random").Random(3).choice("HT") == "H"
    assert out["play"] == ["Heads or tails? Answer \\boxed{H} or \\boxed{T}.",
                           ["Right." if won else "Wrong.", float(won), won, False, {}]]
    assert out["program"] == ["ok", "42\n"]
    assert "toolenv.py" in out["tool"] and out["tool_s"] < 5.0        # a clear error, at once


def test_sandbox_with_toolenv_validates_a_tool_environment(tmp_path):
    out = run_in(["sandbox.py", "toolenv.py"], tmp_path, f"""
        import json
        import sandbox
        with sandbox.Sandbox(workers=1, step_timeout=5.0, pool=1) as sb:
            ok = sb.validate({TOOL!r}, setting="tool")
            broken = sb.validate({TOOL.replace('for lamp in self.lamps]', 'for lamp in self.lamps[:2]]')!r},
                                 setting="tool")
            env = sb.open({TOOL!r}, setting="tool")
            names = [t["function"]["name"] for t in env.tools()]
            env.close()
        print(json.dumps({{"ok": [ok.ok, ok.error], "broken": broken.kind, "tools": names}}))
    """)
    assert out == {"ok": [True, None], "broken": "unsolvable", "tools": ["switch"]}
