"""The suite's skip policy (tests/skip_policy.py): every skip is listed; under CI=true an unexpected
one fails the run, elsewhere it is listed and the run passes."""
import os
import subprocess
import sys
from pathlib import Path

import skip_policy

HERE = Path(__file__).resolve().parent


def test_which_skips_are_expected():
    layer = ("tests/test_sandbox.py::test_secret_file", "layer(s) ['uid'] not available here (rlimits)")
    assert skip_policy.skip_expected(*layer, is_root=False)
    assert not skip_policy.skip_expected(*layer, is_root=True)  # as root (CI) the layers must apply
    # the ids of a run whose rootdir is tests/ (the README's command gives tests/...)
    assert skip_policy.skip_expected(layer[0].removeprefix("tests/"), layer[1], is_root=False)
    assert not skip_policy.skip_expected("test_sandbox_alone.py::test_x", layer[1], is_root=False)
    root = ("tests/test_openenv_hostile.py::test_7_each_worker_has_its_own_scratch",
            "needs root (the sandbox's uid, network and mount namespace layers)")
    assert skip_policy.skip_expected(*root, is_root=False)
    assert not skip_policy.skip_expected(*root, is_root=True)
    bfcl = ("tests/test_eval.py::test_bfcl_ground_truth_replay_scores_100_percent[multi_turn_base]",
            "could not import 'bfcl_eval': install with `pip install --no-deps bfcl-eval`")
    qwen3 = ("tests/test_agent.py::test_real_qwen3_template[qwen3-None]",
             "a fixture is not present")
    chromium = ("tests/test_report.py::test_page_renders_in_chromium", "no chromium on PATH")
    for case in (bfcl, qwen3, chromium):
        assert not skip_policy.skip_expected(*case, is_root=False)
        assert not skip_policy.skip_expected(*case, is_root=True)
    assert skip_policy.skip_expected(*bfcl, is_root=True, allow="x, test_bfcl_ground")


def test_an_unexpected_skip_fails_the_run(tmp_path):
    """A scratch suite under the same hooks: one skipped test makes pytest exit 1 and name it."""
    (tmp_path / "conftest.py").write_text(
        f"import sys\nsys.path.insert(0, {str(HERE)!r})\n"
        "from skip_policy import pytest_runtest_logreport, pytest_sessionfinish, pytest_terminal_summary\n")
    (tmp_path / "test_x.py").write_text("import pytest\n\ndef test_needs_a_thing():\n"
                                        "    pytest.skip('thing missing')\n\ndef test_fine():\n    pass\n")
    env = {k: v for k, v in os.environ.items() if k not in ("SPADE_ALLOW_SKIPS", "CI")}

    def run(**extra):
        return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
                              cwd=tmp_path, env={**env, **extra}, capture_output=True, text=True, timeout=300)
    done = run(CI="true")
    assert done.returncode == 1, done.stdout[-2000:]
    assert "skips: 1 (1 unexpected)" in done.stdout and "1 passed, 1 skipped" in done.stdout
    assert "UNEXPECTED: test_x.py::test_needs_a_thing: thing missing" in done.stdout
    done = run(CI="true", SPADE_ALLOW_SKIPS="test_needs_a_thing")
    assert done.returncode == 0, done.stdout[-2000:]
    assert "expected: test_x.py::test_needs_a_thing: thing missing" in done.stdout
    done = run()  # a fresh clone outside CI: the skip is listed, the run passes
    assert done.returncode == 0, done.stdout[-2000:]
    assert "skipped: test_x.py::test_needs_a_thing: thing missing" in done.stdout
