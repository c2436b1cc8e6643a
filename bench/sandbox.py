"""Sandbox benchmarks (sandbox.py), each figure a ratio against a baseline measured in the same run.

    python bench/sandbox.py          # < 2 minutes on 2 cores; the last lines are JSON figures
    python bench/sandbox.py --smoke  # every measurement at a tenth or less: seconds, figures
                                     # that only show the code runs (tests/test_bench.py)

Targets, for a sandbox that starts a fresh process per episode (exact replay outranks throughput):
  sandbox.episodes_per_s_ratio_vs_spawn  >= 2         20-step episodes/s, 8 at a time, a fresh
                                                      worker each, over a fresh `python -I` each
  sandbox.step_rtt_ratio_vs_pipe         <= 3.5       median step() round trip over a bare pipe
                                                      echo's, both arms pinned to one core
  sandbox.episode_start_ms_p50           ratio <= 3   open + reset, over a bare fork() + exit
  sandbox.timeout_overrun_ms_p95         <= 100       a hanging step's deadline to control back
  sandbox.validations_per_s              report       50 varied environments, 2 workers

Baselines: a fresh `python -I` subprocess per episode (what human-eval / nanochat style harnesses
do), a bare pipe echo between two processes (placed as the trainer and the worker are: both on one
core, the figure; on two cores, `two_cores_ratio`, for context), a bare fork()+exit from this
(small) process; and, to bound what any process-per-episode design can reach, a preloaded
interpreter that forks a child per episode with no isolation and no IPC
(`ceiling_ratio_fresh_process`: spawning's CPU per episode over that floor's;
`ceiling_throughput_ratio`: the episodes/s of that floor with every core busy over spawning's
measured episodes/s, which leaves cores idle).

History (a 2-core VM; "quiet" is load about 1; 2026-12-01 unless said):
- Episodes: 2.5-3.0x spawning (ours 187-220 episodes/s, spawning 67-84); CPU per episode 7.7-9.1 ms
  against 18.0-22.5. Where an episode's CPU goes (ms, profiled with the zygote's preloads and
  namespaces): fork 0.95 in the zygote; in the worker fds 0.17, scratch dir 0.11, rlimits, uid and
  prctl 0.16, Landlock 0.35, seccomp install 0.27 (all of the filter but a 25-instruction pid tail
  is built once in the zygote), reseeding 0.04, exec of the source 0.62, reset + 20 steps 0.21;
  the rest is the kernel: about 800 page faults at 4-5 us (670 in the worker, 120 in the zygote
  after each fork), the page-table copy at fork and the exit teardown. Rebuilding the worker's
  environment dict cost 0.6 ms of copy-on-write faults: workers keep the zygote's allow-listed
  environment and set only HOME and TMPDIR.
- The floor of any process-per-episode design, measured directly: an interpreter with the same
  preloads that already ran the source forks a bare child per episode (no layers, no IPC, no
  exec) and still spends 2.3-2.9 ms of CPU on it (3.5-4.2 if the child executes the source; about
  1 ms less without numpy): 6.6-9.3x spawning's episodes per CPU second, 8.6-12.3x its episodes/s
  with both cores busy (spawning leaves about a quarter of them idle). Our layers, pipes and the
  trainer's side add 5-6 ms an episode, so the former target of 10x would need workers reused
  across episodes, which exact replay forbids.
- Step round trip: left to the scheduler the two ends of a pipe share a core in some rounds and
  not in others (per-round ratios 0.3-9), so both arms are pinned alike. One core 3.09-3.41
  (22.4-24.1 vs 7.1-9.6 us; CPU per step 12.8-14.6 + 10.6-12.0 us trainer + worker, echo 4.0-4.1
  + 3.8-3.9); two cores 1.28-1.42 (97-120 vs 67-85 us: every message wakes an idle core, a VM exit
  here). Reading the reply before polling saved a syscall a step (3.77-3.90 -> 3.35-3.42, trainer
  CPU 17-18.5 -> 14.8 us); writing requests from bytes, not a memoryview, 0.06-0.1. What remains
  is the interpreter on both sides with cold caches after each switch: measured warm, the
  trainer's side of a step is 4.7 us of Python and the worker's 2.4. A worker that encodes no
  reply gave 3.2 (before read-first); one that also skips parsing and the environment call,
  2.5-2.7; the parent's checks cost about 1 us.
- Tried and dropped (no gain beyond the noise): malloc_trim(0) in the zygote before it forks;
  reaping killed workers asynchronously; a fast path for the common step reply (0.1, and a second
  encoder); json's C encoder built once (c_make_encoder: 2.7x faster in a tight loop, no faster
  inside the round trip). Seccomp and Landlock cost nothing measurable (A/B with each off).
- Rejected designs: re-executing the source in a live worker (0.34-0.49 ms) cannot reset
  interpreter state (a hostile environment reaches any stdlib object in place, e.g. `re`'s cache);
  a template process per source would fork its episodes from an interpreter the source's
  module-level code already ran in and could patch (and would need fork() allowed there and one
  uid shared between episodes). One network namespace per zygote is kept: it holds only loopback
  and workers cannot meet there (seccomp allows AF_UNIX sockets only, Landlock denies TCP
  bind/connect and, from ABI 6 (Linux 6.12), scopes abstract unix sockets to the worker).
- Other figures: episode start 2.1-3.2 ms (ratio to a bare fork 1.22-1.71); timeout overrun p95
  2.0-2.5 ms (earlier runs 1.4-3.1); validations 40-49/s (19 pinned to one core).
- After the 100-column rewrite of sandbox.py (later that day, other jobs on both cores, load 1-2.5;
  spawning 30-36 episodes/s and a bare fork 1.8-2.9 ms, two to three times slower than above):
  episodes 2.6-3.5x, one-core step 2.99-4.23 (CPU per step 15.6-19.3 + 12.2-15.1 us, echo 4.8-5.9
  + 4.5-5.9), two cores 2.6-2.8, start 5.7-6.8 ms (ratio 1.98-3.71), overrun p95 4.1-4.9 ms,
  validations 14-18/s. Interleaved with the previous sandbox.py on that machine (previous vs
  now, one core): start 5.4-8.7 vs 5.4-8.3 ms, step 29.4 vs 23.9 us, CPU per step 15.5 + 13.2 vs
  13.6 + 11.3 us (trainer + worker).
"""
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import sandbox  # noqa: E402

ENV = r"""
import random

class Guess{k}Env:
    def __init__(self, max_turns=25):
        self.max_turns = max_turns
    def reset(self, seed=None):
        self.n, self.t = random.Random(seed).randint(1, {hi}), 0
        return "Guess my number in 1-{hi} as \\boxed{{n}}.", {{}}
    def step(self, action):
        self.t += 1
        try:
            g = int(action.strip()[7:-1])
        except ValueError:
            g = -1
        if g == self.n:
            return "Correct!", 1.0, True, False, {{"t": self.t}}
        return ("higher" if g < self.n else "lower"), 0.0, False, self.t >= self.max_turns, {{"t": self.t}}
"""
SRC = ENV.format(k="", hi=10**6)
STEPS = 20
ECHO_ENV = ("class EchoEnv:\n    def reset(self, seed=None):\n        return 'ready', {}\n"
            "    def step(self, action):\n        return action, 0.0, False, False, {}\n")
ACTIONS = [r"\boxed{%d}" % i for i in range(STEPS)]
ALL_CORES = sorted(os.sched_getaffinity(0))
SMOKE = "--smoke" in sys.argv
# repetitions: RTT rounds, steps per RTT arm, episode starts, seconds per throughput arm, hangs
# per kind, validated environments
ROUNDS, RTT_STEPS, STARTS, ARM_S, HANGS, VALIDATIONS = (1, 40, 5, 0.5, 1, 4) if SMOKE else \
    (9, 500, 60, 8.0, 10, 50)

RUNNER = r"""
import sys
ns = {}
exec(sys.stdin.read(), ns)
env = [v for k, v in ns.items() if k.endswith("Env")][-1]()
env.reset(seed=int(sys.argv[1]))
for i in range(%d):
    env.step("\\boxed{%%d}" %% i)
print("done")
""" % STEPS

# The floor of any process-per-episode design: an interpreter with the zygote's preloads that has
# already run the source (a per-source template) forks a child per episode that plays it and exits;
# no isolation layer, no IPC, no exec. CPU per episode, parent + children, after start-up.
FLOOR = r"""
import gc, os, resource, sys, time
sys.path.insert(0, sys.argv[1])
import sandbox
for mod in sandbox.PRELOAD + sandbox.NUMPY_PRELOAD:                  # the bench's Sandbox preloads numpy
    try:
        __import__(mod)
    except ImportError:
        pass
gc.collect()
gc.freeze()
ns = {"__name__": "__environment__"}
exec(compile(sys.stdin.read(), "<environment>", "exec"), ns)
def cpu():
    r, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime + c.ru_utime + c.ru_stime
n, c0, t = 0, cpu(), time.perf_counter()
while time.perf_counter() - t < float(sys.argv[2]):
    pid = os.fork()
    if pid == 0:
        env = [v for k, v in ns.items() if k.endswith("Env")][-1]()
        env.reset(seed=n)
        for i in range(%d):
            env.step("\\boxed{%%d}" %% i)
        os._exit(0)
    os.waitpid(pid, 0)
    n += 1
print((cpu() - c0) / n)
""" % STEPS

HANG = {
    "busy": "while True: pass",
    "sleep": "import time\ntime.sleep(60)",
    "signal_ignoring": "import signal\nfor s in (signal.SIGTERM, signal.SIGINT):\n    signal.signal(s, signal.SIG_IGN)\n"
                       "while True: pass",
    "fork_bomb": "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
}


def hang_env(body):
    body = "\n".join("        " + line for line in body.splitlines())
    return ("class HangEnv:\n    def reset(self, seed=None):\n        return 'hi', {}\n"
            "    def step(self, action):\n" + body + "\n")


def figure(metric, value, target=None, **context):
    print(json.dumps({"metric": metric, "value": round(value, 4), "target": target, **context}))


def cpu_s(pid=None):
    """CPU seconds of this process, or of another one (its scheduler run time, ns resolution)."""
    if pid is None:
        return time.process_time()
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0]) / 1e9


def tree_cpu_s(pid):
    """CPU seconds of a process and of the children it has reaped (/proc stat, clock ticks)."""
    with open(f"/proc/{pid}/stat") as f:
        return sum(map(int, f.read().rsplit(")", 1)[1].split()[11:15])) / os.sysconf("SC_CLK_TCK")


def pin(pid, core) -> bool:
    """Pin a process to one core; False where the OS refuses (then the scheduler places it)."""
    try:
        os.sched_setaffinity(pid, {core})
        return True
    except OSError:
        return False


ECHO_CHILD = """
import os, sys
if sys.argv[1] != "None":
    os.sched_setaffinity(0, {int(sys.argv[1])})
while True:
    d = os.read(0, 65536)
    if not d:
        break
    os.write(1, d)
"""


def pipe_echo_rtt(n=2000, cpu=None, core=None):
    p = subprocess.Popen([sys.executable, "-I", "-c", ECHO_CHILD, str(core)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE)
    msg, out = b'{"op": "step", "action": "\\\\boxed{1}"}\n', []
    for _ in range(50):                                                # the child has started up
        os.write(p.stdin.fileno(), msg)
        os.read(p.stdout.fileno(), 65536)
    c0, w0 = cpu_s(), cpu_s(p.pid)
    for _ in range(n):
        t = time.perf_counter()
        os.write(p.stdin.fileno(), msg)
        os.read(p.stdout.fileno(), 65536)
        out.append(time.perf_counter() - t)
    if cpu is not None:                                                # CPU per round trip, both sides
        cpu.append(((cpu_s() - c0) / n, (cpu_s(p.pid) - w0) / n))
    p.stdin.close()
    p.wait()
    return statistics.median(out)


def rtt_rounds(h, hg, cores, rounds=ROUNDS):
    """Median step() RTT of the echo env (h) and the guessing game (hg) over a pipe echo's, with the
    trainer pinned to cores[0] and the worker and the echo child to cores[1] in both arms. Short
    adjacent rounds, ratio per round: the load of a shared machine hits both arms alike."""
    tcore, wcore = cores
    pinned = pin(0, tcore)
    rtts, pipes, guess, ratios, pipe_cpu, step_cpu = [], [], [], [], [], []
    for _ in range(rounds):
        pipes.append(pipe_echo_rtt(RTT_STEPS, pipe_cpu, wcore if pinned else None))
        for handle, out in ((h, rtts), (hg, guess)):
            pinned &= pin(handle.pid, wcore)
            ts, c0, w0 = [], cpu_s(), cpu_s(h.pid)
            for i in range(RTT_STEPS):
                if i % STEPS == 0 and handle is hg:                    # stay inside its turn budget; every
                    handle.reset(seed=i)                               # reset starts a fresh worker
                    pinned &= pin(handle.pid, wcore)
                t = time.perf_counter()
                handle.step(ACTIONS[i % STEPS])
                ts.append(time.perf_counter() - t)
            out.append(statistics.median(ts))
            if handle is h:
                step_cpu.append(((cpu_s() - c0) / RTT_STEPS, (cpu_s(h.pid) - w0) / RTT_STEPS))
        ratios.append(rtts[-1] / pipes[-1])
        time.sleep(0.3)                                                # the zygote refills its pool after
                                                                       # the resets: not transport time
    os.sched_setaffinity(0, ALL_CORES)
    return dict(ratio=statistics.median(ratios), rtt=statistics.median(rtts), pipe=statistics.median(pipes),
                guess=statistics.median(guess), ratios=ratios, pinned=pinned,
                step_cpu=[min(c[i] for c in step_cpu) for i in (0, 1)],
                pipe_cpu=[min(c[i] for c in pipe_cpu) for i in (0, 1)])


def main():
    t_start = time.time()
    with sandbox.Sandbox(workers=2, step_timeout=5.0) as sb:
        print(f"# sandbox level: {sb.level}")
        # -- step round trip vs a bare pipe echo (interleaved so machine load hits both alike)
        # The transport is what is measured: a constant env (no work in step), as the echo does none.
        h, hg = sb.open(ECHO_ENV), sb.open(SRC)
        h.reset(seed=0)
        hg.reset(seed=0)
        time.sleep(0.5)                                                # the zygote refills its fork pool
        for handle in (h, hg):                                         # steady state, as in training
            for i in range(STEPS):
                handle.step(ACTIONS[i])
        # Placement decides a round trip, so both arms get the same one. On one core (trainer and
        # worker pinned together) nothing waits for a wake-up: the RTT is the CPU both sides spend,
        # the strict figure. On two cores every message wakes an idle core: the regime of training,
        # whose workers run beside the trainer, where the wake-ups dominate (context).
        same = rtt_rounds(h, hg, (ALL_CORES[0], ALL_CORES[0]))
        cross = rtt_rounds(h, hg, ALL_CORES[:2]) if len(ALL_CORES) > 1 else None
        h.close()
        hg.close()
        print(f"# step rtt, one core: {same['rtt'] * 1e6:.1f} us (guessing-game env {same['guess'] * 1e6:.1f} us), "
              f"pipe echo {same['pipe'] * 1e6:.1f} us" + (" (pinning refused: unpinned)" if not same["pinned"] else ""))
        if cross:
            print(f"# step rtt, two cores: {cross['rtt'] * 1e6:.1f} us, pipe echo {cross['pipe'] * 1e6:.1f} us")

        # -- episode start: open + reset of a fresh isolated worker (what every episode gets), vs
        # re-executing the source in a fresh namespace of a live interpreter (the rejected option:
        # cheaper, but it keeps the interpreter's global state), vs a bare fork()+exit here
        starts, reexecs = [], []
        for i in range(STARTS):
            time.sleep(0.02)                                           # a trainer does work between opens
            t = time.perf_counter()
            h = sb.open(SRC)
            h.reset(seed=i)
            starts.append(time.perf_counter() - t)
            h.close()
            t = time.perf_counter()
            ns = {"__name__": "__environment__"}
            exec(compile(SRC, "<environment>", "exec"), ns)
            [v for k, v in ns.items() if k.endswith("Env")][-1]().reset(seed=i)
            reexecs.append(time.perf_counter() - t)
        forks = []
        for _ in range(STARTS):
            t = time.perf_counter()
            pid = os.fork()
            if pid == 0:
                os._exit(0)
            os.waitpid(pid, 0)
            forks.append(time.perf_counter() - t)
        start, fork = statistics.median(starts), statistics.median(forks)

        # -- completed 20-step episodes per second: ours (8 at a time, a fresh worker each) vs spawn
        n_eps, t, c0, z0 = 0, time.perf_counter(), cpu_s(), tree_cpu_s(sb._proc.pid)
        while time.perf_counter() - t < ARM_S:
            hs = [sb.open(SRC) for _ in range(8)]
            sb.reset_many(hs, list(range(n_eps, n_eps + 8)))
            for a in ACTIONS:
                sb.step_many(hs, [a] * 8)
            for h in hs:
                h.close()
            n_eps += 8
        ours = n_eps / (time.perf_counter() - t)
        ours_cpu = (cpu_s() - c0 + tree_cpu_s(sb._proc.pid) - z0) / n_eps   # trainer + zygote + workers
        seq_eps, t = 0, time.perf_counter()
        while time.perf_counter() - t < ARM_S / 2:
            h = sb.open(SRC)
            h.reset(seed=seq_eps)
            for a in ACTIONS:
                h.step(a)
            h.close()
            seq_eps += 1
        ours_seq = seq_eps / (time.perf_counter() - t)
        spawn_eps, t, k0 = 0, time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
        while time.perf_counter() - t < ARM_S:
            procs = [subprocess.Popen([sys.executable, "-I", "-c", RUNNER, str(spawn_eps + j)],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE) for j in range(8)]
            for p in procs:
                p.communicate(SRC.encode())
            spawn_eps += 8
        spawn = spawn_eps / (time.perf_counter() - t)
        k1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        spawn_cpu = (k1.ru_utime + k1.ru_stime - k0.ru_utime - k0.ru_stime) / spawn_eps
        cores = len(ALL_CORES)                                         # the affinity rtt_rounds restored
        floor_cpu = float(subprocess.run([sys.executable, "-s", "-B", "-c", FLOOR, os.path.dirname(sandbox.__file__),
                                          str(ARM_S / 2)], input=SRC, capture_output=True, text=True, check=True).stdout)
        print(f"# episodes/s: ours {ours:.1f} (8 concurrent), ours one at a time {ours_seq:.1f}, "
              f"fresh python -I per episode {spawn:.1f} (8 concurrent)")
        print(f"# CPU per episode: ours {ours_cpu * 1e3:.2f} ms, spawning {spawn_cpu * 1e3:.2f} ms, bare fork of a "
              f"preloaded interpreter that ran the source (no layers, no IPC) {floor_cpu * 1e3:.2f} ms: any "
              f"process-per-episode design reaches at most {spawn_cpu / floor_cpu:.1f}x spawning's episodes per "
              f"CPU second, and {cores / floor_cpu / spawn:.1f}x its episodes/s with all {cores} cores busy")

        # -- timeout overrun: deadline -> caller has control again
        overruns, named = {k: [] for k in HANG}, {}
        with sandbox.Sandbox(workers=2, step_timeout=0.2, pool=2) as short:
            for name, body in HANG.items():
                for _ in range(HANGS):
                    h = short.open(hang_env(body))
                    h.reset(seed=0)
                    t = time.monotonic()
                    r = h.step("x")
                    overruns[name].append(time.monotonic() - t - 0.2)
                    named[getattr(r, "fault", None)] = named.get(getattr(r, "fault", None), 0) + 1
                    h.close()
        allv = sorted(v for vs in overruns.values() for v in vs)
        p95 = allv[int(0.95 * (len(allv) - 1))]
        print("# timeout overrun p95 by kind (ms): " + ", ".join(
            f"{k} {sorted(v)[int(0.95 * (len(v) - 1))] * 1e3:.1f}" for k, v in overruns.items()))

        # -- validation probes per second, 50 varied envs, 2 workers
        sources = [ENV.format(k=i, hi=5 + 7 * i) for i in range(VALIDATIONS)]
        t = time.perf_counter()
        with ThreadPoolExecutor(sb.workers) as pool:                 # as train.py's designer does
            reports = list(pool.map(sb.validate, sources))
        vps = len(sources) / (time.perf_counter() - t)
        n_ok = sum(r.ok for r in reports)

    print(f"# total bench time {time.time() - t_start:.1f} s")
    figure("sandbox.episodes_per_s_ratio_vs_spawn", ours / spawn, ">= 2", ours=round(ours, 1),
           spawn=round(spawn, 1), ours_one_at_a_time=round(ours_seq, 1),
           cpu_ms_per_episode_ours_spawn=[round(ours_cpu * 1e3, 2), round(spawn_cpu * 1e3, 2)],
           cpu_ms_per_episode_bare_fork=round(floor_cpu * 1e3, 2),
           ceiling_ratio_fresh_process=round(spawn_cpu / floor_cpu, 2),
           ceiling_throughput_ratio=round(cores / floor_cpu / spawn, 2))
    us = lambda xs: [round(x * 1e6, 1) for x in xs]                    # noqa: E731
    figure("sandbox.step_rtt_ratio_vs_pipe", same["ratio"], "<= 3.5", placement="one core",
           pinned=same["pinned"],
           step_us=round(same["rtt"] * 1e6, 1), pipe_us=round(same["pipe"] * 1e6, 1),
           guessing_game_step_us=round(same["guess"] * 1e6, 1), round_ratios=[round(r, 2) for r in same["ratios"]],
           cpu_us_per_step_trainer_worker=us(same["step_cpu"]), cpu_us_per_echo_trainer_child=us(same["pipe_cpu"]),
           **({} if cross is None else dict(
               two_cores_ratio=round(cross["ratio"], 2), two_cores_step_pipe_us=us([cross["rtt"], cross["pipe"]]),
               two_cores_round_ratios=[round(r, 2) for r in cross["ratios"]])))
    figure("sandbox.episode_start_ms_p50", start * 1e3, "ratio <= 3", ratio_vs_fork=round(start / fork, 2),
           fork_ms=round(fork * 1e3, 3), reexec_in_fresh_namespace_ms=round(statistics.median(reexecs) * 1e3, 3))
    figure("sandbox.timeout_overrun_ms_p95", p95 * 1e3, "<= 100", failures=named)
    figure("sandbox.validations_per_s", vps, "report", envs=len(sources), valid=n_ok, workers=2)


if __name__ == "__main__":
    main()
