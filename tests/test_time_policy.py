"""The suite's time policy (tests/time_policy.py): a test over the limit that is not marked slow is
listed; under CI=true it fails the run; its CPU time, not its wall time alone, decides."""
import os
import subprocess
import sys
from pathlib import Path

import time_policy

HERE = Path(__file__).resolve().parent


def test_which_tests_are_over():
    limit, wall_limit = time_policy.LIMIT_S, time_policy.WALL_LIMIT_S
    assert (limit, wall_limit) == (10.0, 60.0)
    assert time_policy.over(wall=12.0, cpu=11.0)           # busy 11 s: over on any machine
    assert not time_policy.over(wall=25.0, cpu=6.0)        # a 6 s test stretched by the load
    assert not time_policy.over(wall=8.0, cpu=16.0)        # two ranks in parallel, 8 s of wall
    assert not time_policy.over(wall=9.0, cpu=9.0)
    assert time_policy.over(wall=61.0, cpu=0.5)            # a minute of waiting (sleeps, servers)


def test_a_slow_test_without_the_marker_fails_the_run(tmp_path):
    """A scratch suite under the same hooks, its limits lowered: the unmarked test that burns CPU
    past the limit makes pytest exit 1 under CI and is named; one marked slow, and one that only
    sleeps past it (wall time, little CPU: what load does to a test), pass."""
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    slow: slow\n")
    (tmp_path / "conftest.py").write_text(
        f"import sys\nsys.path.insert(0, {str(HERE)!r})\nimport time_policy\n"
        "time_policy.LIMIT_S, time_policy.WALL_LIMIT_S = 0.3, 30.0\n\n"
        "def pytest_configure(config):\n    config.pluginmanager.register(time_policy)\n")
    (tmp_path / "test_x.py").write_text(
        "import time\nimport pytest\n\n"
        "def burn():\n    end = time.process_time() + 0.5\n    while time.process_time() < end:\n"
        "        pass\n\n"
        "def test_busy():\n    burn()\n\n"
        "@pytest.mark.slow\ndef test_busy_and_marked():\n    burn()\n\n"
        "def test_waits():\n    time.sleep(0.5)\n")
    env = {k: v for k, v in os.environ.items() if k != "CI"}

    def run(**extra):
        return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                               str(tmp_path)], cwd=tmp_path, env={**env, **extra},
                              capture_output=True, text=True, timeout=300)
    done = run(CI="true")
    assert done.returncode == 1, done.stdout[-2000:]
    assert "3 passed" in done.stdout and "not marked slow: 1 (fail the run under CI)" in done.stdout
    assert "too slow: test_x.py::test_busy: " in done.stdout
    assert "test_busy_and_marked" not in done.stdout and "test_waits" not in done.stdout
    done = run()  # outside CI: listed, and the run passes
    assert done.returncode == 0, done.stdout[-2000:]
    assert "too slow: test_x.py::test_busy: " in done.stdout
