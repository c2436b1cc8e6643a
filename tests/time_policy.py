"""The suite's time policy, as pytest hooks that tests/conftest.py registers: a test not marked
`slow` stays under LIMIT_S seconds, its setup, call and teardown together (a module fixture's
work counts in the test that first needs it), so the default tier (`-m "not slow"`, pytest.ini)
stays fast as tests are added. Under CI (`CI=true`, which .ci/run sets, and which runs every
tier) a test over it fails the run (exit status 1), as an unexpected skip does
(tests/skip_policy.py); elsewhere it is listed, and the run passes. Mark it `slow`, or make it
faster.

What is measured. The suite's machines are shared (2 cores, often beside a training run): wall
time alone would flake with the load. A test's CPU time (this process's threads and the child
processes it waited for: getrusage) moves far less with load, so a test is over when its CPU time
and its wall time both pass LIMIT_S. Both: two ranks in parallel spend 16 CPU seconds in 8 s, and
reaping a module's sandbox charges its workers' whole CPU time to one test of no wall time. CPU
time misses waiting (sleeps, servers, processes not waited for), so a test whose wall time alone
passes WALL_LIMIT_S is over too: a load that stretches a test to 6x its CPU time is far beyond
this suite's (1.5-2x beside other jobs). The unit tier's heaviest test spends about 4 CPU seconds,
well inside the limit. Standard library + pytest.
"""
import resource
import time

import pytest

from skip_policy import strict

LIMIT_S = 10.0
WALL_LIMIT_S = 60.0
_OVER: list[tuple[str, float, float]] = []  # (test id, wall s, CPU s)


def cpu_seconds() -> float:
    """CPU seconds of this process and of its children that were waited for, so far."""
    own, kids = (resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def over(wall: float, cpu: float) -> bool:
    """Whether a test of `wall` seconds that spent `cpu` CPU seconds is over the limit."""
    return (wall > LIMIT_S and cpu > LIMIT_S) or wall > WALL_LIMIT_S


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    wall, cpu = time.perf_counter(), cpu_seconds()
    yield
    wall, cpu = time.perf_counter() - wall, cpu_seconds() - cpu
    if item.get_closest_marker("slow") is None and over(wall, cpu):
        _OVER.append((item.nodeid, wall, cpu))


def pytest_terminal_summary(terminalreporter):
    if not _OVER:
        return
    tag = "fail the run under CI" if strict() else "listed; under CI=true they fail the run"
    terminalreporter.section(f"tests over {LIMIT_S:.0f} s not marked slow: {len(_OVER)} ({tag})")
    for nodeid, wall, cpu in _OVER:
        terminalreporter.write_line(f"too slow: {nodeid}: {wall:.1f} s wall, {cpu:.1f} s CPU")
    terminalreporter.write_line("mark them @pytest.mark.slow or make them faster "
                                "(tests/time_policy.py)")


def pytest_sessionfinish(session, exitstatus):
    if strict() and _OVER and exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
