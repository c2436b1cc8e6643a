"""Adversarial tests for sandbox.py: one property of the threat model per test, plus honest envs
(README, "Running model-written code safely").

Every hostile program is small and bounded (short deadlines, small bombs) so a broken sandbox cannot
take the machine down. Tests that need a kernel layer skip when `Sandbox.layers` lacks it.
"""
import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest

import sandbox
import toolenv
from sandbox import Sandbox, SandboxInfraError

# Per-call deadline of the shared sandbox: every honest call (validation included) must answer
# within it on a loaded 2-core CI box, so it is generous; hostile calls hang forever, so a test still
# tells "timed out" from "never returned". SLACK bounds how late control may come back under load.
STEP_TIMEOUT = 2.0
SLACK = 5.0
SECRET = "spade-secret-7f3a9c"


@pytest.fixture(scope="module")
def sb():
    os.environ["SPADE_TEST_SECRET_TOKEN"] = SECRET                    # must never reach a worker
    with Sandbox(workers=2, step_timeout=STEP_TIMEOUT, memory_mb=256, pool=2) as s:
        yield s
    os.environ.pop("SPADE_TEST_SECRET_TOKEN", None)


def need(sb, *layers):
    missing = [x for x in layers if x not in sb.layers]
    if missing:
        pytest.skip(f"layer(s) {missing} not available here ({sb.level})")


def need_any(sb, *layers):
    if not any(x in sb.layers for x in layers):
        pytest.skip(f"none of {layers} available here ({sb.level})")


def src(body: str) -> str:
    return textwrap.dedent(body)


def game(step: str, reset: str = "return 'Say something as \\\\boxed{x}.', {}", head: str = "") -> str:
    """A games env whose step()/reset() bodies are given (indented 8 spaces in the class)."""
    ind = lambda s: textwrap.indent(textwrap.dedent(s).strip("\n"), " " * 8)  # noqa: E731
    return (textwrap.dedent(head) + "\nclass HostileEnv:\n    def __init__(self, max_turns=10):\n"
            "        self.t = 0\n    def reset(self, seed=None):\n" + ind(reset) + "\n"
            "    def step(self, action):\n        self.t += 1\n" + ind(step) + "\n")


def play(sb, source, actions=("\\boxed{1}",), seed=0):
    h = sb.open(source)
    try:
        h.reset(seed=seed)
        return [h.step(a) for a in actions]
    finally:
        h.close()


def err(result):
    return getattr(result, "fault", None)


def group_alive(pgid: int) -> bool:
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[2]) == pgid:
                        return True
            except (OSError, IndexError, ValueError):
                pass
    return False


def eventually(cond, timeout=3.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


HONEST = src(r"""
    import random

    class GuessEnv:
        def __init__(self, max_turns=6):
            self.max_turns = max_turns
        def reset(self, seed=None):
            rng = random.Random(seed)
            self.n, self.t = rng.randint(1, 50), 0
            return f"Guess my number in 1-50 as \\boxed{{n}}. You have {self.max_turns} turns.", {"seed": seed}
        def step(self, action):
            self.t += 1
            try:
                g = int(action.strip()[7:-1])
            except ValueError:
                return "Answer as \\boxed{n}.", 0.0, False, self.t >= self.max_turns, {}
            if g == self.n:
                return "Correct!", 1.0, True, False, {"t": self.t}
            hint = "higher" if g < self.n else "lower"
            return f"Wrong, go {hint}.", 0.0, False, self.t >= self.max_turns, {"t": self.t}
""")


# ------------------------------------------------------------------ honest environments must pass
def kernel_grants() -> dict:
    """What this kernel grants a child of ours, probed apart from sandbox.py: a new network namespace
    (root with CAP_SYS_ADMIN) and Landlock (ABI >= 1)."""
    probe = ("import ctypes, json, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
             "libc.syscall.restype = ctypes.c_long\n"
             "print(json.dumps({'netns': os.geteuid() == 0 and libc.unshare(0x40000000) == 0,"
             " 'landlock': libc.syscall(444, None, 0, 1) >= 1}))")
    return json.loads(subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                                     check=True, timeout=60).stdout)


def test_level_reported(sb):
    """The level names exactly the layers achieved; and where the kernel grants a network namespace or
    Landlock, the sandbox must have them, so a layer that silently stops applying fails here rather
    than skipping the tests that need it (a root container without CAP_SYS_ADMIN reports "reduced")."""
    missing = [x for x in sandbox.FULL if x not in sb.layers]
    assert "rlimits" in sb.layers
    assert sb.level.startswith(f"reduced (missing {', '.join(missing)})" if missing else "full"), sb.level
    assert ("+landlock" in sb.level) == ("landlock" in sb.layers)
    grants = kernel_grants()
    if grants["netns"]:
        assert not missing and "mountns" in sb.layers, sb.level
    if grants["landlock"]:
        assert "landlock" in sb.layers, sb.level


def test_honest_env_validates_and_replays_exactly(sb):
    rep = sb.validate(HONEST)
    assert rep.ok and rep.error is None and rep.kind is None and rep.class_name == "GuessEnv"
    script = ["\\boxed{25}", "\\boxed{12}", "\\boxed{40}", "junk"]
    a, b = play(sb, HONEST, script, seed=7), play(sb, HONEST, script, seed=7)
    assert a == b and all(err(r) is None for r in a)
    h = sb.open(HONEST)
    obs, info = h.reset(seed=3)
    assert obs.startswith("Guess my number") and info == {"seed": 3}
    n = __import__("random").Random(3).randint(1, 50)
    assert h.step(f"\\boxed{{{n}}}") == ("Correct!", 1.0, True, False, {"t": 1})
    h.close()


def test_numpy_rewards_and_flags_pass(sb):
    pytest.importorskip("numpy")
    env = game("return 'ok ' + str(np.int64(self.t)), np.float64(0.5), np.bool_(self.t >= 2), np.False_, "
               "{'v': np.arange(3), 'x': np.float32(1.5)}", head="import numpy as np")
    assert sb.validate(env).ok
    r1, r2 = play(sb, env, ["a", "b"])
    assert r1 == ("ok 1", 0.5, False, False, {"v": [0, 1, 2], "x": 1.5})
    assert type(r2[1]) is float and r2[2] is True


def test_partial_rewards_and_bare_string_reset(sb):
    env = game("return f'progress {self.t}', 0.25 * self.t, self.t >= 4, False, {}", reset="return 'go'")
    assert sb.validate(env).ok
    out = play(sb, env, ["a"] * 4)
    assert [r[1] for r in out] == [0.25, 0.5, 0.75, 1.0] and out[-1][2] is True


def test_long_legal_observation_unchanged_and_cap_applied(sb):
    legal = ("é€𝄞 ab\n\t" * 4000)[:32_000]
    env = game(f"return {legal!r} if self.t == 1 else 'x' * 100_000, 0.0, False, False, {{}}")
    assert sb.validate(env).ok
    r1, r2 = play(sb, env, ["a", "b"])
    assert r1[0] == legal and err(r1) is None
    assert r2[0] == "x" * sandbox.OBS_CAP and err(r2) is None


def test_pythonhashseed_pinned_so_honest_sets_are_deterministic(sb):
    env = game("return ','.join({'apple', 'pear', 'fig', 'kiwi', str(self.t)}), 0.0, False, False, {}")
    assert sb.validate(env).ok
    assert play(sb, env, ["a", "b"]) == play(sb, env, ["a", "b"])


def test_honest_step_results_in_the_common_shapes_pass_through(sb):
    """The worker writes a step reply's scalar fields itself: namedtuples, ints, numpy-free floats and
    a non-empty info must arrive as the plain JSON values they are."""
    env = game("return Step(f'obs {self.t}', self.t, self.t > 1, False, {'t': [self.t, 0.5]})",
               head="import collections\nStep = collections.namedtuple('Step', 'o r te tr i')\n")
    assert play(sb, env, ["a", "b"]) == [("obs 1", 1.0, False, False, {"t": [1, 0.5]}),
                                         ("obs 2", 2.0, True, False, {"t": [2, 0.5]})]


TOOL_ENV = src(r"""
    class ShopEnv(ToolEnv):
        TOOLS = [
            {"name": "lookup_order", "description": "Status of an order.",
             "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}},
                            "required": ["order_id"]}},
            {"name": "cancel_order", "description": "Cancel an order.",
             "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}},
                            "required": ["order_id"]}},
            {"name": "refund", "description": "Refund a cancelled order.",
             "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}},
                            "required": ["order_id"]}},
        ]
        def setup(self, rng):
            self.oid = str(rng.randint(100, 999))
            self.state = {"orders": {self.oid: "shipped"}, "seen": False, "refunded": False}
            self.instructions = [
                (f"Look up order {self.oid}.", lambda s: s["seen"]),
                (f"Cancel order {self.oid}.", lambda s: s["orders"][self.oid] == "cancelled"),
                (f"Refund order {self.oid}.", lambda s: s["refunded"]),
            ]
        def tool_lookup_order(self, order_id):
            if order_id not in self.state["orders"]:
                return "No such order."
            self.state["seen"] = True
            return f"Order {order_id}: {self.state['orders'][order_id]}"
        def tool_cancel_order(self, order_id):
            self.state["orders"][order_id] = "cancelled"
            return "Cancelled."
        def tool_refund(self, order_id):
            if self.state["orders"].get(order_id) != "cancelled":
                return "Error: cancel first."
            self.state["refunded"] = True
            return "Refunded."
        def solution(self):
            return [{"name": n, "arguments": {"order_id": self.oid}}
                    for n in ("lookup_order", "cancel_order", "refund")]
""")


def call(name, **args):
    return "<tool_call>" + json.dumps({"name": name, "arguments": args}) + "</tool_call>"


def test_tool_env_validates_and_plays(sb):
    rep = sb.validate(TOOL_ENV, setting="tool")
    assert rep.ok, rep.error
    h = sb.open(TOOL_ENV, setting="tool")
    schemas = h.tools()
    assert [t["type"] for t in schemas] == ["function"] * 3
    assert schemas[0]["function"]["name"] == "lookup_order"
    obs, info = h.reset(seed=0)
    oid = __import__("random").Random(0).randint(100, 999)
    assert obs == f"Look up order {oid}." and info["tools"] == schemas
    assert h.step("I think I should look it up") == (toolenv.FORMAT_REMINDER, -0.1, False, False,
                                                     {"tool_outputs": []})
    o, r, term, trunc, info = h.step(call("lookup_order", order_id=str(oid)) + call("nope"))
    assert r == 0.0 and not term and len(info["tool_outputs"]) == 2
    assert info["tool_outputs"][0] == f"Order {oid}: shipped\n\nNext instruction: Cancel order {oid}."
    assert "unknown tool" in info["tool_outputs"][1] and o == "\n".join(info["tool_outputs"])
    o, r, term, trunc, info = h.step("<answer>done</answer>")           # premature: play continues
    assert (r, term, trunc) == (0.0, False, False) and f'"Cancel order {oid}."' in o
    h.reset(seed=0)
    outs = [h.step(call(n, order_id=str(oid)))[0] for n in ("lookup_order", "cancel_order", "refund")]
    assert outs[-1].endswith(toolenv.ALL_DONE)
    assert h.step("<answer>done</answer>")[1:3] == (1.0, True)
    h.close()


def test_tool_env_turn_budget_truncates(sb):
    h = sb.open(TOOL_ENV.replace("class ShopEnv(ToolEnv):", "class ShopEnv(ToolEnv):\n"
                                 "    def __init__(self):\n        super().__init__(max_turns=2)"),
                setting="tool")
    h.reset(seed=1)
    assert h.step(call("lookup_order", order_id="1"))[3] is False         # tool calls are free
    assert h.step("x")[3] is False and h.step("<answer>done</answer>")[3] is True
    h.close()


def test_unsolvable_tool_env_rejected(sb):
    broken = TOOL_ENV.replace('for n in ("lookup_order", "cancel_order", "refund")]',
                              'for n in ("lookup_order", "refund")]')
    rep = sb.validate(broken, setting="tool")
    assert not rep.ok and rep.kind == "unsolvable"
    done_at_reset = TOOL_ENV.replace('lambda s: s["seen"]', 'lambda s: True')
    assert sb.validate(done_at_reset, setting="tool").kind == "unsolvable"
    assert sb.validate(HONEST, setting="tool").kind == "load_error"    # not a ToolEnv


def test_load_errors_named(sb):
    assert sb.validate("class Broken(:\n").kind == "load_error"
    assert sb.validate("x = 1\n").kind == "load_error"
    assert sb.validate("class AEnv:\n    def __init__(self):\n        raise KeyError('no')\n").kind == "load_error"
    assert sb.validate(game("return 'x', 0.0, False, False, {}", reset="raise ValueError('r')")).kind == "reset_error"
    assert sb.validate(game("raise RuntimeError('boom')")).kind == "step_error"
    t0 = time.monotonic()
    assert sb.validate("while True:\n    pass\n").kind == "timeout"       # hangs at import
    assert time.monotonic() - t0 < STEP_TIMEOUT + SLACK


# ------------------------------------------------- 1. the trainer survives everything, within deadline
@pytest.mark.parametrize("body", [
    "while True: pass",
    "import time\ntime.sleep(60)",
    "import signal\nfor s in (signal.SIGTERM, signal.SIGINT, signal.SIGALRM, signal.SIGXCPU):\n"
    "    signal.signal(s, signal.SIG_IGN)\nwhile True: pass",
], ids=["busy", "sleep", "signal_ignoring"])
def test_hang_times_out_within_deadline(sb, body):
    h = sb.open(game(body))
    h.reset(seed=0)
    pid = h.pid
    t0 = time.monotonic()
    r = h.step("\\boxed{1}")
    assert err(r) == "timeout" and r[2] is True and r[0].startswith("[environment error: timeout]")
    assert time.monotonic() - t0 < STEP_TIMEOUT + SLACK
    assert eventually(lambda: not group_alive(pid))
    assert err(h.step("x")) == "timeout"                               # the episode stays over
    assert h.reset(seed=1)[0].startswith("Say")                        # recycled into a fresh worker
    h.close()


def test_memory_bomb_is_memory_limit(sb):
    assert err(play(sb, game("x = bytearray(4 << 30)\nreturn 'no', 0.0, False, False, {}"))[0]) == "memory_limit"
    r = play(sb, game("a = []\nwhile True: a.append(bytes(32 << 20))"))[0]
    assert err(r) == "memory_limit"


def test_cpu_limit_named():
    with Sandbox(workers=1, step_timeout=10.0, cpu_seconds=1, numpy=False, pool=0) as s:
        r = play(s, game("while True: pass"))[0]
    assert err(r) == "cpu_limit"


def test_episode_time_budget():
    with Sandbox(workers=1, step_timeout=1.0, episode_timeout=0.6, numpy=False, pool=0) as s:
        out = play(s, game("import time\ntime.sleep(0.25)\nreturn 'z', 0.0, False, False, {}"), ["a"] * 5)
    assert err(out[0]) is None and "episode_timeout" in [err(r) for r in out]


def test_signals_ptrace_renice_cannot_reach_caller(sb):
    need(sb, "seccomp")
    me = os.getpid()
    niceness = os.getpriority(os.PRIO_PROCESS, me)                     # the runner may itself be niced
    env = game(f"""
        import ctypes, os, signal
        res = []
        for name, fn in [("ppid", lambda: os.kill(os.getppid(), signal.SIGKILL)),
                         ("trainer", lambda: os.kill({me}, signal.SIGTERM)),
                         ("all", lambda: os.kill(-1, signal.SIGKILL)),
                         ("group", lambda: os.killpg({me}, signal.SIGTERM)),
                         ("renice", lambda: os.setpriority(os.PRIO_PROCESS, {me}, 19))]:
            try:
                fn(); res.append(name + ':done')
            except OSError as e:
                res.append(name + ':' + type(e).__name__)
        libc = ctypes.CDLL(None, use_errno=True)
        res.append('ptrace:' + str(libc.ptrace(16, {me}, 0, 0)))      # PTRACE_ATTACH
        return ' '.join(res), 0.0, False, False, {{}}
    """)
    obs = play(sb, env)[0][0]
    assert "done" not in obs and "ptrace:-1" in obs, obs
    assert os.getpriority(os.PRIO_PROCESS, me) == niceness
    assert sb.validate(HONEST).ok                                      # zygote and caller still fine


def test_os_exit_and_segfault_and_base_exception(sb):
    assert err(play(sb, game("import os\nos._exit(3)"))[0]) == "worker_exited"
    assert err(play(sb, game("import ctypes\nctypes.string_at(0)"))[0]) == "worker_crashed"
    assert err(play(sb, game("class Out(BaseException): pass\nraise Out('x')"))[0]) == "step_error"
    assert err(play(sb, game("raise SystemExit(0)"))[0]) == "step_error"
    assert err(play(sb, game("import os\nos.close(4)\nimport time\ntime.sleep(5)"))[0]) == "worker_crashed"


def test_environment_cannot_fake_a_sandbox_fault(sb):
    """The set-up's exit codes (70, 71) mean nothing once untrusted code has run: an environment that
    exits with them is the environment's fault, never a SandboxInfraError that stops the trainer."""
    for code in (70, 71):
        env = f"import os\nos._exit({code})\n" + HONEST
        assert sb.validate(env).kind == "worker_exited"
        h = sb.open(env)
        assert err(h.reset(seed=0)) == "worker_exited"
        h.close()


def test_an_error_key_in_info_is_the_environments_own(sb):
    """A Gym idiom: info {"error": ...} on an invalid move. It is the environment's data, arrives
    intact, and is no fault: the fault channel is the result object (sandbox.Fault), not the info."""
    env = game("return 'Invalid move.', 0.0, False, False, {'error': 'invalid move', 'message': 'm'}")
    assert sb.validate(env).ok
    [r] = play(sb, env)
    assert type(r) is tuple and err(r) is None
    assert r == ("Invalid move.", 0.0, False, False, {"error": "invalid move", "message": "m"})


def test_environment_cannot_forge_the_fault_channel(sb):
    """Hostile: every part of a fault result forged (the error observation, 0.0, terminated, info
    keys "error"/"message"/"fault"/"kind" saying timeout or infra, a tuple subclass carrying
    `fault` and `message` attributes). None of it comes out as a fault: a reply is rebuilt here
    as a plain tuple, and the info arrives as written."""
    forged = {"error": "infra: forged", "message": "m", "fault": "timeout", "kind": "timeout"}
    head = ("class Forged(tuple):\n    fault = 'timeout'\n    message = 'forged'\n"
            f"INFO = {forged!r}\n")
    env = game("return Forged(('[environment error: timeout] forged', 0.0, True, False, INFO))",
               reset="return Forged(('[environment error: timeout] forged', INFO))", head=head)
    h = sb.open(env)
    try:
        first = h.reset(seed=0)
        r = h.step("x")
    finally:
        h.close()
    for result, info in ((first, first[1]), (r, r[4])):
        assert type(result) is tuple and not isinstance(result, sandbox.Fault)
        assert err(result) is None and info == forged
    assert r[:4] == ("[environment error: timeout] forged", 0.0, True, False)


def test_an_empty_first_observation_is_rejected_a_blank_one_passes(sb):
    """The authors' load (at validation and before every play) rejects a reset observation of
    length 0 and takes a whitespace-only one; so here, at validation and at every reset."""
    empty = game("return 'o', 0.0, False, False, {}", reset="return '', {}")
    report = sb.validate(empty)
    assert (report.ok, report.kind) == (False, "invalid_observation") and "empty" in report.error
    assert sb.validate(game("return 'o', 0.0, False, False, {}", reset="return ' \\n', {}")).ok
    # in play: empty only at seed 7, which validation never probes
    late = game("return 'o', 0.0, False, False, {}", reset="return '' if seed == 7 else 'o', {}")
    h = sb.open(late)
    try:
        assert err(h.reset(seed=7)) == "invalid_observation" and err(h.reset(seed=8)) is None
    finally:
        h.close()


# The authors' prompt example trades at a random price without importing random: a game of that
# kind, in our words, leaning on the names their loader binds (no import statement anywhere).
UNIMPORTED = src(r"""
    class BarterEnv:
        def __init__(self, max_turns=6):
            self.max_turns = max_turns
        def reset(self, seed=None):
            self.rng = random.Random(seed)
            self.price: Optional[int] = self.rng.randint(2, 9)
            self.seen = deque(maxlen=3)
            self.t = 0
            return f"Offer a price as \\boxed{{n}}; a root of {math.isqrt(16)} is a clue.", {}
        def step(self, action):
            self.t += 1
            guess = int(re.sub(r"\D", "", action) or 0)
            self.seen.append(guess)
            counts: Dict[int, int] = Counter(self.seen)
            won = guess == self.price
            done = won or self.t >= self.max_turns
            text = json.dumps({"guesses": list(self.seen), "repeats": max(counts.values())})
            return text, 1.0 if won else 0.0, done, False, {}
""")


def test_common_names_resolve_unimported_as_the_authors_loader(sb):
    """A game using random, math, re, json, deque, Counter and typing names without an import
    validates and plays (the authors' loader binds them; a bare namespace: NameError)."""
    report = sb.validate(UNIMPORTED)
    assert report.ok, report.error
    assert play(sb, UNIMPORTED, actions=("\\boxed{3}", "\\boxed{3}"))[1][0] == \
        '{"guesses": [3, 3], "repeats": 2}'


# The authors' loader's names, read off their list (and typed here again as a cross-check).
AUTHORS_NAMES = set(
    "math random re json collections itertools functools string copy heapq operator statistics "
    "np numpy deque defaultdict Counter OrderedDict namedtuple combinations permutations product "
    "chain accumulate reduce lru_cache deepcopy heappush heappop Tuple Dict List Optional Union "
    "Any Set FrozenSet Callable Iterable Sequence Mapping".split())
# Reports, for every name bound in its namespace, whether it is the object an import returns.
CHECK_NAMES = src("""
    heappop = "the game's own"
    class CheckEnv:
        def reset(self, seed=None):
            same = {}
            for name, path in NAMES.items():
                if name in globals():
                    module, _, attribute = path.partition(".")
                    obj = __import__(module)
                    same[name] = globals()[name] is (getattr(obj, attribute) if attribute else obj)
            return json.dumps(same), {}
        def step(self, action):
            return "o", 0.0, True, False, {}
""")


def first_observation(sb, source):
    h = sb.open(source)
    try:
        return h.reset(seed=0)[0]
    finally:
        h.close()


def test_common_names_are_the_objects_an_import_gives(sb):
    """The bound names are the authors' 41, each the very object the game's own import returns
    (nothing it could not import itself); a game may rebind one; np / numpy only when the
    sandbox preloads numpy."""
    pytest.importorskip("numpy")
    names = {**sandbox.COMMON_NAMES, **sandbox.NUMPY_NAMES}
    assert set(names) == AUTHORS_NAMES and len(names) == 41
    env = f"NAMES = {names!r}\n" + CHECK_NAMES
    assert json.loads(first_observation(sb, env)) == {n: n != "heappop" for n in names}
    with Sandbox(workers=1, step_timeout=STEP_TIMEOUT, numpy=False, pool=0) as bare:
        without = json.loads(first_observation(bare, env))
    assert without == {n: n != "heappop" for n in names if n not in ("np", "numpy")}


def test_a_constructor_that_requires_max_turns_gets_the_budget():
    """The authors' play builds the class with its own defaults, and on a TypeError with
    max_turns=<the agent's budget>; here the Sandbox's max_turns."""
    env = game("return 'o', 0.0, False, False, {}", reset="return f'{self.max_turns} turns', {}")
    env = env.replace("def __init__(self, max_turns=10):", "def __init__(self, max_turns):\n"
                      "        self.max_turns = max_turns")
    with Sandbox(workers=1, step_timeout=STEP_TIMEOUT, numpy=False, pool=0, max_turns=7) as s:
        assert s.validate(env).ok
        h = s.open(env)
        try:
            assert h.reset(seed=0)[0] == "7 turns"
        finally:
            h.close()


def test_a_games_own_larger_turn_budget_is_cut_to_the_agents():
    """As the authors' play sets max_turns = min(the game's, the agent's): a game whose default is
    40 plays 7 turns under a Sandbox of 7; one whose default is 5 keeps its 5."""
    env = game("return 'o', 0.0, False, False, {}", reset="return f'{self.max_turns} turns', {}")
    for default, seen in [(40, "7 turns"), (5, "5 turns")]:
        src_ = env.replace("def __init__(self, max_turns=10):",
                           f"def __init__(self, max_turns={default}):\n"
                           "        self.max_turns = max_turns")
        with Sandbox(workers=1, step_timeout=STEP_TIMEOUT, numpy=False, pool=0, max_turns=7) as s:
            h = s.open(src_)
            try:
                assert h.reset(seed=0)[0] == seen
            finally:
                h.close()


# ------------------------------------------------------------------------- 2. no secret leaves
def test_env_vars_and_proc_environ_hidden(sb):
    need_any(sb, "uid", "landlock")
    env = game(f"""
        import os, json
        out = [json.dumps(dict(os.environ))]
        for p in ('/proc/{os.getpid()}/environ', '/proc/1/environ', f'/proc/{{os.getppid()}}/environ'):
            try:
                out.append(open(p, 'rb').read().decode(errors='replace'))
            except OSError as e:
                out.append(type(e).__name__)
        return ' | '.join(out), 0.0, False, False, {{}}
    """)
    obs = play(sb, env)[0][0]
    assert SECRET not in obs and "SPADE_TEST_SECRET_TOKEN" not in obs
    assert json.loads(obs.split(" | ")[0]).keys() <= {"PATH", "HOME", "TMPDIR", "LANG", "PYTHONHASHSEED",
                                                      "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS",
                                                      "LC_ALL", "MKL_NUM_THREADS"}


@pytest.mark.needs_root
def test_secret_files_unreadable(sb, tmp_path):
    need(sb, "uid")
    planted = tmp_path / "token"
    planted.write_text(SECRET)
    planted.chmod(0o644)
    fd, home = tempfile.mkstemp(prefix=".spade_test_token_", dir=os.path.expanduser("~"))
    with os.fdopen(fd, "w") as f:                                      # unique: parallel runs never collide
        f.write(SECRET)
    targets = [str(planted), home]
    try:
        env = game(f"""
            out = []
            for p in {targets!r}:
                try:
                    out.append(open(p).read()[:200])
                except OSError as e:
                    out.append(type(e).__name__)
            return ' | '.join(out), 0.0, False, False, {{}}
        """)
        parts = play(sb, env)[0][0].split(" | ")
    finally:
        os.remove(home)
    assert SECRET not in parts[0] and SECRET not in parts[1]


def test_project_files_unreadable(sb):
    """A world-readable file of the project (sandbox.py itself) is outside Landlock's read list."""
    need(sb, "landlock")
    env = game(f"""
        try:
            return open({os.path.abspath(sandbox.__file__)!r}).read()[:200], 0.0, False, False, {{}}
        except OSError as e:
            return type(e).__name__, 0.0, False, False, {{}}
    """)
    assert play(sb, env)[0][0] in ("PermissionError", "FileNotFoundError")


@pytest.mark.needs_root
def test_other_environment_memory_unreadable(sb):
    need(sb, "uid")
    a = sb.open(game("return 'a', 0.0, False, False, {}", head=f"SECRET = {SECRET!r}"))
    a.reset(seed=0)
    env = game(f"""
        out = []
        for p in ('/proc/{a.pid}/mem', '/proc/{a.pid}/environ', '/proc/{a.pid}/maps'):
            try:
                out.append(open(p, 'rb').read(4096).decode(errors='replace'))
            except OSError as e:
                out.append(type(e).__name__)
        return ' | '.join(out), 0.0, False, False, {{}}
    """)
    obs = play(sb, env)[0][0]
    a.close()
    assert SECRET not in obs and obs.count("Error") == 3, obs


# ------------------------------------------------------------- 3. no side effects outside scratch
@pytest.mark.needs_root
def test_writes_outside_scratch_blocked_and_scratch_removed(sb, tmp_path):
    need(sb, "uid")
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    victim.chmod(0o666)
    tag = os.urandom(4).hex()                                          # a regression's files never meet a later run
    project = os.path.join(os.path.dirname(os.path.abspath(sandbox.__file__)), f"sbx_evil_{tag}.txt")
    root_file = f"/root/evil_{tag}"
    env = game(f"""
        import os
        out = []
        for p in ({str(open_dir / 'evil')!r}, {project!r}, {root_file!r}, '../evil', '/var/tmp/evil'):
            try:
                open(p, 'w').write('x'); out.append('wrote ' + p)
            except OSError as e:
                out.append(type(e).__name__)
        try:
            os.remove({str(victim)!r}); out.append('deleted')
        except OSError as e:
            out.append(type(e).__name__)
        if action == 'look':
            return ' '.join(sorted(os.listdir('.'))) or 'empty', 0.0, False, False, {{}}
        open('mine.txt', 'w').write('scratch is fine')
        return os.getcwd() + ' | ' + ' '.join(out) + ' | ' + open('mine.txt').read(), 0.0, False, False, {{}}
    """)
    h = sb.open(env)
    h.reset(seed=0)
    try:
        obs = h.step("x")[0]
        assert not os.path.exists(project) and not os.path.exists(root_file)
    finally:
        for path in (project, root_file):
            with contextlib.suppress(OSError):
                os.remove(path)
    cwd = obs.split(" | ")[0]
    assert "wrote" not in obs and "deleted" not in obs and obs.endswith("scratch is fine"), obs
    assert not (open_dir / "evil").exists() and victim.read_text() == "keep"
    view = f"/proc/{sb._proc.pid}/root{cwd}"                           # the zygote's mount namespace
    h.reset(seed=0)                                                    # the next episode: a fresh worker
    assert h.step("look")[0] == "empty"                                # with a fresh, empty scratch
    assert eventually(lambda: not os.path.exists(view))                # the old one is removed
    h.close()


def test_no_network(sb):
    need_any(sb, "netns", "seccomp", "landlock")
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    port = listener.getsockname()[1]
    env = game(f"""
        import socket
        out = []
        try:
            socket.create_connection(('127.0.0.1', {port}), timeout=0.5); out.append('tcp connected')
        except OSError as e:
            out.append(type(e).__name__)
        try:
            u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.sendto(b'x', ('127.0.0.1', {port}))
            out.append('udp sent')
        except OSError as e:
            out.append(type(e).__name__)
        return ' '.join(out), 0.0, False, False, {{}}
    """)
    try:
        obs = play(sb, env)[0][0]
        assert "connected" not in obs and "sent" not in obs, obs
        assert not select.select([listener], [], [], 0.2)[0]
    finally:
        listener.close()


def test_bounded_fork_bomb_and_no_lingering_processes(sb):
    env = game("""
        import os, time
        for _ in range(16):
            if os.fork() == 0:
                time.sleep(20)
                os._exit(0)
        return 'forked', 0.0, False, False, {}
    """)
    h = sb.open(env)
    h.reset(seed=0)
    pid = h.pid
    r = h.step("x")
    # the first fork is refused (seccomp as root: EPERM; RLIMIT_NPROC 0 without root: EAGAIN),
    # so the environment's own step fails; a bomb that merely hung would be a timeout instead
    assert err(r) == "step_error", r
    assert r.message.startswith(("PermissionError", "BlockingIOError")), r
    h.close()
    assert eventually(lambda: not group_alive(pid))
    assert sb.validate(env).ok is False


def test_no_exec_no_subprocess(sb):
    need(sb, "seccomp")
    env = game("""
        import os, subprocess
        out = []
        for name, fn in [("exec", lambda: os.execv("/bin/sh", ["sh", "-c", "true"])),
                         ("run", lambda: subprocess.run(["true"])),
                         ("system", lambda: os.system("true"))]:
            try:
                r = fn(); out.append(f"{name}:{r}")
            except OSError as e:
                out.append(f"{name}:{type(e).__name__}")
        return ' '.join(out), 0.0, False, False, {}
    """)
    obs = play(sb, env)[0][0]
    assert obs.startswith("exec:PermissionError run:PermissionError system:"), obs
    assert "system:0" not in obs


@pytest.mark.needs_root
def test_thread_left_running_is_resource_leak(sb):
    need(sb, "uid")                                                    # else RLIMIT_NPROC=0: no threads
    env = game("""
        import threading, time
        threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
        return 'left a thread', 0.0, self.t >= 3, False, {}
    """)
    assert sb.validate(env).kind == "resource_leak"
    h = sb.open(env)
    h.reset(seed=0)
    pid = h.pid
    out = [h.step("x") for _ in range(3)]
    assert err(out[-1]) == "resource_leak"
    h.close()
    assert eventually(lambda: not group_alive(pid))


def test_print_flood_and_fd_hygiene(sb):
    env = game("""
        import os, sys
        for i in range(20000):
            print('flood', i)
        sys.stderr.write('x' * 100000)
        os.write(1, b'{"ok": 1, "r": ["forged", 10, true, false, {}]}\\n')
        fds = []
        for i in range(256):
            try:
                os.fstat(i); fds.append(i)
            except OSError:
                pass
        null = [os.fstat(i).st_rdev == os.makedev(1, 3) for i in (0, 1, 2)]
        return f'{fds} {null}', 0.0, False, False, {}
    """)
    obs, reward, *_ = play(sb, env)[0]
    assert reward == 0.0 and obs == "[0, 1, 2, 3, 4] [True, True, True]", obs


# --------------------------------------------------------------------- 4. rewards cannot be forged
@pytest.mark.parametrize("expr,kind", [
    ("float('nan')", "invalid_reward"),
    ("float('inf')", "invalid_reward"),
    ("True", "invalid_reward"),
    ("'1.0'", "invalid_reward"),
    ("11.0", "invalid_reward"),
    ("10**30", "invalid_reward"),
    ("None", "invalid_reward"),
])
def test_bad_rewards_rejected(sb, expr, kind):
    assert err(play(sb, game(f"return 'o', {expr}, False, False, {{}}"))[0]) == kind
    assert sb.validate(game(f"return 'o', {expr}, False, False, {{}}")).kind == kind


def test_float_subclass_cannot_lie(sb):
    env = game("""
        class Liar(float):
            def __float__(self): return 1.0
            def __repr__(self): return '1.0'
            def __eq__(self, o): return True
            def __le__(self, o): return True
            def __ge__(self, o): return True
        return 'o', Liar(0.25), False, False, {}
    """)
    r = play(sb, env)[0]
    assert r[1] == 0.25 and type(r[1]) is float
    nan_liar = env.replace("Liar(0.25)", "Liar('nan')")
    assert err(play(sb, nan_liar)[0]) == "invalid_reward"


@pytest.mark.parametrize("obs_expr,kind", [
    ("Fake()", "invalid_observation"),
    ("b'bytes'", "invalid_observation"),
    ("'a\\x00b'", "invalid_observation"),
    ("'lone \\ud800 surrogate'", "invalid_observation"),
], ids=["fake_str", "bytes", "nul", "lone_surrogate"])
def test_bad_observations_rejected(sb, obs_expr, kind):
    env = game(f"""
        class Fake:
            __class__ = property(lambda self: str)
            def __str__(self): return 'fake'
        return {obs_expr}, 0.0, False, False, {{}}
    """)
    assert err(play(sb, env)[0]) == kind


def test_str_subclass_observation_is_copied_exactly(sb):
    env = game("""
        class S(str):
            def __str__(self): return 'lie'
            def __len__(self): return 0
        return S('truth'), 0.0, False, False, {}
    """)
    r = play(sb, env)[0]
    assert r[0] == "truth" and type(r[0]) is str


@pytest.mark.parametrize("ret,kind", [
    ("'o', 0.0, 1, False, {}", "invalid_result"),
    ("'o', 0.0, False, False, []", "invalid_result"),
    ("'o', 0.0, False, False, {'k': '\\udc80'}", "invalid_result"),
    ("'o', 0.0, False, False, {'k': object()}", None),                 # friendliness: str(obj)
    ("('o', 0.0, False)", "invalid_result"),
])
def test_bad_result_shapes(sb, ret, kind):
    assert err(play(sb, game(f"return {ret}"))[0]) == kind


def test_the_result_checks_are_pure_functions_of_plain_values():
    """check_reset / check_step: what the parent applies to every reply, and the in-process and
    OpenEnv handles to theirs. No side effect: the same values give the same answer, and a fault
    is a FaultError naming its kind, never a kill."""
    long = "o" * (sandbox.OBS_CAP + 7)
    assert sandbox.check_reset(long, {"k": ["v"]}) == ("o" * sandbox.OBS_CAP, {"k": ["v"]})
    out = sandbox.check_step("o", 1, True, False, {})
    assert out == ("o", 1.0, True, False, {}) and type(out[1]) is float
    assert sandbox.check_step("o", -10, False, True, {})[1] == -10.0          # the bounds pass
    bad = [
        (("a\x00b", 0.0, False, False, {}), "invalid_observation", "observation: contains NUL"),
        ((b"o", 0.0, False, False, {}), "invalid_observation", "observation: is not a str"),
        (("o", 0.0, False, False, []), "invalid_result", "info: is not a dict"),
        (("o", 0.0, False, False, {"k": "\udc80"}), "invalid_result", "info: lone surrogate"),
        (("o", 10.5, False, False, {}), "invalid_reward", "reward 10.5 is not in [-10, 10]"),
        (("o", True, False, False, {}), "invalid_reward", "reward True is not in [-10, 10]"),
        (("o", 0.0, 1, False, {}), "invalid_result", "terminated/truncated are not bools"),
        # The observation is checked first, then the info, then the reward and flags.
        (("a\x00", 11.0, 1, False, []), "invalid_observation", "observation: contains NUL"),
    ]
    for args, kind, message in bad * 2:
        with pytest.raises(sandbox.FaultError) as e:
            sandbox.check_step(*args)
        assert (e.value.kind, e.value.message) == (kind, message)
    with pytest.raises(sandbox.FaultError, match="info: is not a dict"):
        sandbox.check_reset("o", None)


def test_fault_of_builds_every_fault_result():
    """Fault.of: the error observation as the result's items, the kind under `kind` and under the
    `fault` attribute every reader tests, the message shortened and printable."""
    f = sandbox.Fault.of("timeout", "no reply \x1b[2J" + "x" * 400, step=True)
    message = "no reply ?[2J" + "x" * (300 - len("no reply ?[2J"))
    assert f == (f"[environment error: timeout] {message}", 0.0, True, False, {})
    assert (f.kind, f.fault, f.message) == ("timeout", "timeout", message)
    r = sandbox.Fault.of("reset_error", "m", step=False)
    assert r == ("[environment error: reset_error] m", {}) and err(r) == "reset_error"
    assert err(("o", {})) is None and err(("o", 0.0, True, False, {})) is None


def test_fault_of_error_names_our_kinds_and_a_librarys_type():
    """Fault.of_error, for exceptions caught outside a worker: a FaultError keeps its own kind and
    message; any other exception is the caller's kind, with its type named."""
    ours = sandbox.Fault.of_error(sandbox.FaultError("invalid_observation", "a list"),
                                  "step_error", step=True)
    assert (ours.kind, ours.message) == ("invalid_observation", "a list") and len(ours) == 5
    lib = sandbox.Fault.of_error(KeyError("x"), "reset_error", step=False)
    assert (lib.kind, lib.message, len(lib)) == ("reset_error", "KeyError: 'x'", 2)


# ------------------------------------------------------------------- 5. the protocol cannot be hijacked
@pytest.mark.needs_root
def test_forged_extra_reply_line_kills_worker(sb):
    need(sb, "uid")                                                    # the late forger is a thread
    forged = '{"ok": 1, "r": ["forged", 10, true, false, {}]}\\n'
    r = play(sb, game(f"import os\nos.write(4, b'{forged}')\nreturn 'real', 0.0, False, False, {{}}"))[0]
    assert err(r) == "protocol_violation" and r[1] == 0.0
    late = game(f"""
        import os, threading, time
        def later():
            time.sleep(0.05)
            os.write(4, b'{forged}')
        threading.Thread(target=later, daemon=True).start()
        return 'real', 0.0, False, False, {{}}
    """)
    h = sb.open(late)
    h.reset(seed=0)
    assert h.step("a")[0] == "real"
    time.sleep(0.2)
    assert err(h.step("b")) == "protocol_violation"
    h.close()
    garbage = game("import os, time\nos.write(4, b'not json\\n')\ntime.sleep(5)")
    assert err(play(sb, garbage)[0]) == "protocol_violation"


def test_oversized_reply_line(sb):
    r = play(sb, game("import os, time\nos.write(4, b'x' * (3 << 20))\ntime.sleep(5)"))[0]
    assert err(r) == "output_too_large"
    assert err(play(sb, game("return 'o', 0.0, False, False, {'big': 'y' * (2 << 20)}"))[0]) == "output_too_large"


def test_long_request_on_a_pipe_numbered_over_1023(sb):
    """A request longer than the pipe holds waits for room with poll(), which select() could not do
    for the pipe fds of a trainer holding over a thousand of them."""
    src = f"BLOB = {'y' * 300_000!r}\n" + HONEST                      # the load request: ~300 kB
    held = [os.pipe() for _ in range(520)]                              # push new fds past 1023
    try:
        h = sb.open(src)
        assert h._wfd > 1023 and h.reset(seed=3)[0].startswith("Guess my number")
        h.close()
    finally:
        for fds in held:
            list(map(os.close, fds))


# ------------------------------------------------------------ 6. time of check is not time of use
def test_hostile_after_validation_caught_at_play_time(sb):
    env = game("""
        if self.t > 4:
            while True: pass
        return 'fine', 0.0, False, False, {}
    """, reset="self.t = 0\nreturn 'hi', {}")
    assert sb.validate(env).ok                                         # probes stop before step 5
    out = play(sb, env, ["x"] * 5)
    assert [err(r) for r in out] == [None] * 4 + ["timeout"]


def test_hostile_off_the_probe_script_caught_at_validation(sb):
    on_seed = game("return 'o', 0.0, False, False, {}",
                   reset="if seed not in (42, 123):\n    while True: pass\nreturn 'hi', {}")
    assert sb.validate(on_seed).kind == "timeout"
    on_action = game("if action not in ('\\\\boxed{1}', '\\\\boxed{test}', '\\\\boxed{42}'):\n"
                     "    import os; os._exit(1)\nreturn 'o', 0.0, False, False, {}")
    assert sb.validate(on_action).kind == "worker_exited"


# ----------------------------------------------------------------- 7. determinism is checked
@pytest.mark.parametrize("reset", [
    "import time\nreturn f'now {time.time_ns()}', {}",
    "import random\nreturn f'roll {random.random()}', {}",
    "import os\nreturn f'pid {os.getpid()}', {}",
    "import uuid\nreturn f'id {uuid.uuid4()}', {}",
], ids=["clock", "unseeded_random", "pid", "uuid"])
def test_nondeterministic_env_rejected(sb, reset):
    rep = sb.validate(game("return 'o', 0.0, False, False, {}", reset=reset))
    assert not rep.ok and rep.kind == "nondeterministic", rep


# ------------------------------------------------------------------------- 8. nothing is lost
def test_batch_failures_end_only_their_own_episode(sb):
    hostile = [game("while True: pass"), game("import os\nos._exit(1)"), game("return 'o', float('nan'), False, False, {}")]
    handles = [sb.open(HONEST) for _ in range(5)] + [sb.open(s) for s in hostile]
    obs = sb.reset_many(handles, list(range(len(handles))))
    assert all(o.startswith(("Guess", "Say")) for o, _ in obs)
    t0 = time.monotonic()
    out = sb.step_many(handles, ["\\boxed{25}"] * len(handles))
    assert time.monotonic() - t0 < STEP_TIMEOUT + SLACK
    assert [err(r) for r in out] == [None] * 5 + ["timeout", "worker_exited", "invalid_reward"]
    again = sb.step_many(handles[:5], ["\\boxed{30}"] * 5)
    assert all(err(r) is None for r in again)
    for h in handles:
        h.close()


def test_dead_zygote_is_restarted_and_infra_faults_raise(monkeypatch):
    s = Sandbox(workers=1, numpy=False, pool=0)
    h = s.open(HONEST)
    h.reset(seed=0)
    os.kill(s._proc.pid, signal.SIGKILL)                               # workers die with it (pdeathsig)
    s._proc.wait()
    r = h.step("\\boxed{1}")
    assert r[2] is True and err(r) in ("worker_exited", "worker_crashed")
    assert s.validate(HONEST).ok                                       # a fresh zygote took over
    os.kill(s._proc.pid, signal.SIGKILL)
    s._proc.wait()
    monkeypatch.setattr(sandbox.sys, "executable", "/nonexistent/python")
    with pytest.raises(SandboxInfraError):
        s.open(HONEST)
    with pytest.raises(SandboxInfraError):
        s.validate(HONEST)
    s.close()


def test_a_worker_that_fails_its_set_up_is_the_sandboxs_fault():
    """A worker gone before its set-up's WORKER_READY (here: it lacks a layer the sandbox requires,
    so it fails closed) is a failure of the sandbox: SandboxInfraError, never an environment fault,
    and the handle raises it again until a new episode gets a fresh worker."""
    with Sandbox(workers=1, numpy=False, pool=0) as s:
        h = s.open(HONEST)
        h.reset(seed=0)
        h.step("\\boxed{1}")                                          # the next episode: a new worker
        s._required = [*s._required, "no_such_layer"]
        with pytest.raises(SandboxInfraError, match="worker set-up failed"):
            h.reset(seed=0)
        with pytest.raises(SandboxInfraError, match="worker set-up failed"):
            h.step("\\boxed{1}")
        s._required = s._required[:-1]
        assert h.reset(seed=0)[0].startswith("Guess my number")
        h.close()


# ------------------------------------ every episode starts from a freshly executed module (exact replay)
LEAKY = {
    "mutable_class_attribute": ("", "history = []", "self.history.append(action)\nn = len(self.history)"),
    "class_counter": ("", "count = 0", "type(self).count += 1\nn = type(self).count"),
    "module_list": ("SEEN = []", "", "SEEN.append(action)\nn = len(SEEN)"),
    "module_random_seed": ("import random\nrandom.seed(5)", "", "n = random.randint(0, 10**9)"),
    "stdlib_module_state": ("import json", "", "json.calls = getattr(json, 'calls', 0) + 1\nn = json.calls"),
}


@pytest.mark.parametrize("name", list(LEAKY))
def test_first_and_tenth_episode_are_byte_identical(sb, name):
    head, attr, body = LEAKY[name]
    env = (f"{head}\n\nclass LeakyEnv:\n    {attr or 'pass'}\n    def reset(self, seed=None):\n"
           f"        self.rng, action = __import__('random').Random(seed), 'reset'\n"
           + textwrap.indent(body, " " * 8) + "\n        return f'first {n} {self.rng.random()}', {}\n"
           "    def step(self, action):\n" + textwrap.indent(body, " " * 8)
           + "\n        return f'n={n}', 0.0, False, False, {'n': n}\n")
    h = sb.open(env)
    episodes = []
    for i in range(10):                                                # one handle: a worker per episode
        if i == 5:
            h.close()
            h = sb.open(env)                                           # ... and across handles
        episodes.append(json.dumps([h.reset(seed=7)] + [h.step(a) for a in ("a", "b", "c")]).encode())
    h.close()
    assert err(json.loads(episodes[0])[1]) is None, episodes[0]
    assert episodes[9] == episodes[0] and len(set(episodes)) == 1, (episodes[0], episodes[9])


def test_slow_environment_rejected_as_too_slow():
    """A call at 40% of step_timeout is far from both the 25% threshold and the deadline."""
    with Sandbox(workers=1, step_timeout=2.0, numpy=False, pool=2) as s:
        slow_reset = game("return 'o', 0.0, False, False, {}", reset="import time\ntime.sleep(0.8)\nreturn 'hi', {}")
        rep = s.validate(slow_reset)
        assert rep.kind == "too_slow" and "median reset call took " in rep.error, rep
        rep = s.validate(game("import time\ntime.sleep(0.8)\nreturn 'o', 0.0, False, False, {}"))
        assert rep.kind == "too_slow" and "median step call" in rep.error, rep
        took = float(rep.error.split("took ")[1].split(" s")[0])
        assert 0.8 <= took < 2.0                                       # the measured time, not the limit
        assert s.validate(HONEST).ok                                   # honest calls take milliseconds


def test_per_file_size_limit_holds():
    with Sandbox(workers=1, fsize_mb=1, numpy=False, pool=0) as s:
        env = game("""
            try:
                with open('big.bin', 'wb') as f:
                    f.write(b'x' * (3 << 20))
                out = 'wrote'
            except OSError as e:
                out = f'errno {e.errno}'
            import os
            return f'{out} {os.path.getsize("big.bin")}', 0.0, False, False, {}
        """)
        obs = play(s, env)[0][0]
    assert obs == f"errno 27 {1 << 20}", obs                           # EFBIG at exactly 1 MiB


def test_scratch_tmpfs_caps_the_total():
    """As root, scratch lives on a private tmpfs of scratch_mb: files each under the per-file limit
    still stop at the cap (ENOSPC), so workers cannot fill the host's disk between them."""
    with Sandbox(workers=1, scratch_mb=2, fsize_mb=16, numpy=False, pool=0) as s:
        need(s, "mountns")
        env = game("""
            n = 0
            try:
                for i in range(8):
                    with open(f'f{i}.bin', 'wb') as f:
                        f.write(b'x' * (1 << 20))
                    n += 1
                out = 'wrote all'
            except OSError as e:
                out = f'errno {e.errno}'
            return f'{out} after {n}', 0.0, False, False, {}
        """)
        obs = play(s, env)[0][0]
    assert obs.startswith("errno 28 after ") and int(obs.split()[-1]) <= 2, obs   # ENOSPC near 2 MiB



def test_own_scratch_gives_each_worker_its_own_tmpfs():
    """own_scratch (the OpenEnv server's sessions): two live workers each write 3 MiB into a
    scratch of 4 MiB; with one tmpfs for all (the default) the second stops at ENOSPC."""
    fill = game("""
        n = 0
        try:
            for i in range(3):
                with open(f'f{i}.bin', 'wb') as f:
                    f.write(b'x' * (1 << 20))
                n += 1
            return f'wrote {n}', 0.0, False, False, {}
        except OSError as e:
            return f'errno {e.errno} after {n}', 0.0, False, False, {}
    """)
    seen = {}
    for own in (False, True):
        with Sandbox(workers=1, scratch_mb=4, numpy=False, pool=0, own_scratch=own) as s:
            need(s, "mountns")
            a, b = s.open(fill), s.open(fill)
            a.reset(seed=0), b.reset(seed=0)
            seen[own] = [a.step("x")[0], b.step("x")[0]]
            a.close(), b.close()
    assert seen[True] == ["wrote 3", "wrote 3"]
    assert seen[False][0] == "wrote 3" and seen[False][1].startswith("errno 28"), seen

# ------------------------------------------------ whole programs (LiveCodeBench) under the same layers
def test_run_program_honest_and_named_failures(sb):
    assert sb.run_program("print(int(input()) * 2)", "21\n") == ("ok", "42\n")
    assert sb.run_program("import sys\nprint(sum(map(int, open(0).read().split())))\nsys.exit(0)",
                          "1 2 3") == ("ok", "6\n")
    assert sb.run_program("import sys\nsys.stdout.buffer.write(sys.stdin.buffer.read()[::-1])", "abc") == ("ok", "cba")
    assert sb.run_program("raise SystemExit(3)") == ("error", "")
    assert sb.run_program("print('partial')\n1/0") == ("error", "partial\n")
    assert sb.run_program("x = bytearray(4 << 30)")[0] == "error"     # MemoryError inside the program
    assert sb.run_program("print('x' * 100)", out_cap=10) == ("ok", "x" * 10)


@pytest.mark.needs_root
def test_run_program_hostile_gets_no_secret_no_network_and_cannot_stall(sb, tmp_path):
    need(sb, "uid")
    planted = tmp_path / "token"
    planted.write_text(SECRET)
    planted.chmod(0o644)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))                                    # the OS picks the port; kept bound
    listener.listen(4)
    port = listener.getsockname()[1]
    code = src(f"""
        import os, socket
        out = [os.environ.get('SPADE_TEST_SECRET_TOKEN', 'no-env')]
        for p in ({str(planted)!r}, os.path.expanduser('~/.cache/huggingface/token')):
            try:
                out.append(open(p).read())
            except OSError as e:
                out.append(type(e).__name__)
        try:
            socket.create_connection(('127.0.0.1', {port}), timeout=0.5); out.append('connected')
        except Exception as e:                                         # OSError, or a codec it cannot load
            out.append(type(e).__name__)
        try:
            out.append('forked' if os.fork() == 0 else 'parent')
        except OSError as e:
            out.append(type(e).__name__)
        print(' '.join(out))
    """)
    try:
        status, out = sb.run_program(code)
        assert status == "ok" and SECRET not in out and "connected" not in out and "fork" not in out, out
        assert not select.select([listener], [], [], 0.2)[0]
    finally:
        listener.close()
    t0 = time.monotonic()
    assert sb.run_program("while True: pass", timeout=0.5) == ("timeout", "")
    assert sb.run_program("import time\ntime.sleep(60)", timeout=0.5) == ("timeout", "")
    assert time.monotonic() - t0 < 1.0 + SLACK


@pytest.mark.parametrize("r,kind", [
    ('["\\uD800", 0.0, false, false, {}]', "invalid_observation"),
    ('["a\\u0000b", 0.0, false, false, {}]', "invalid_observation"),
    ('[{"fake": "str"}, 0.0, false, false, {}]', "invalid_observation"),
    ('["ok", 1e999, false, false, {}]', "invalid_reward"),
    ('["ok", true, false, false, {}]', "invalid_reward"),
    ('["ok", NaN, false, false, {}]', "protocol_violation"),
    ('["ok", 0.5, 1, false, {}]', "invalid_result"),
    ('["ok", 0.5, false, false, {"k": ["\\udc00"]}]', "invalid_result"),
    ('["ok", 0.5, false, false]', "protocol_violation"),
], ids=["surrogate", "nul", "obs_object", "inf", "bool", "nan", "int_flag", "info_surrogate", "short"])
def test_parent_revalidates_a_forger_that_knows_the_nonce(sb, r, kind):
    """Worker-side checks are friendliness: a forger that bypasses them still meets the parent's."""
    env = game(f"""
        import os, sys, time
        f = sys._getframe(1)
        while 'nonce' not in f.f_locals:                               # read it from the serve loop
            f = f.f_back
        os.write(4, f.f_locals['nonce'] + b'=' + {r!r}.encode() + b'\\n')  # a well-formed reply line
        time.sleep(5)
    """)
    res = play(sb, env)[0]
    assert err(res) == kind and res[1] == 0.0 and res[2] is True
