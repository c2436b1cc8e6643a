"""Shared fixtures: tiny offline models built once per session; the hub is off for every test.

Skip policy: every skip is listed with its reason at the end of the run, and a skip nobody expects
fails the run (exit status 1), so CI cannot go green on tests that silently did not run (BFCL
without bfcl-eval, the Qwen3 template tests without ../shared/fixtures, the sandbox's root-only
layers as root). Expected: a sandbox layer missing when not running as root (the layers need root).
`SPADE_ALLOW_SKIPS=substr1,substr2` allows skips whose test id contains one of the substrings
(a machine that genuinely lacks something; say why where you set it)."""
import os
import sys
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import pytest  # noqa: E402
import torch  # noqa: E402

# The tiny models' matmuls are far too small for threads: one thread is 10-50x faster on a shared
# 2-core machine, for every test alike.
torch.set_num_threads(1)

SHARED_FIXTURES = ROOT.parent / "shared" / "fixtures"


@pytest.fixture(scope="session")
def tiny():
    """(model, tokenizer) of the tiny random Qwen3; treat as read-only (copy before training)."""
    import engine
    return engine.build_tiny("tiny", seed=0)


@pytest.fixture(scope="session")
def tiny_moe():
    """(model, tokenizer) of the tiny random Qwen3-MoE; treat as read-only."""
    import engine
    return engine.build_tiny("tiny-moe", seed=0)


@pytest.fixture(scope="session")
def tokenizer(tiny):
    return tiny[1]


@pytest.fixture(scope="session")
def qwen3_template():
    """The public Qwen3 hybrid-thinking template from ../shared/fixtures (skips when absent)."""
    path = SHARED_FIXTURES / "qwen3_hybrid_chat_template.jinja"
    if not path.exists():
        pytest.skip("../shared/fixtures/qwen3_hybrid_chat_template.jinja is not present")
    return path.read_text(encoding="utf-8")


# ----------------------------------------------------------------------------------------------
# Skip policy (see the module docstring)

_SKIPS: list[tuple[str, str]] = []


def skip_expected(nodeid: str, reason: str, is_root: bool, allow: str = "") -> bool:
    """Whether a skip of `nodeid` for `reason` is one this suite expects."""
    if any(a.strip() and a.strip() in nodeid for a in allow.split(",")):
        return True
    sandbox_layer = nodeid.startswith("tests/test_sandbox.py::") and "available here" in reason
    return sandbox_layer and not is_root


def pytest_runtest_logreport(report):
    if report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        _SKIPS.append((report.nodeid, reason.removeprefix("Skipped: ")))


def _unexpected():
    is_root = hasattr(os, "geteuid") and os.geteuid() == 0
    allow = os.environ.get("SPADE_ALLOW_SKIPS", "")
    return [(n, r) for n, r in _SKIPS if not skip_expected(n, r, is_root, allow)]


def pytest_terminal_summary(terminalreporter):
    if not _SKIPS:
        return
    bad = _unexpected()
    terminalreporter.section(f"skips: {len(_SKIPS)} ({len(bad)} unexpected)")
    for nodeid, reason in _SKIPS:
        tag = "UNEXPECTED" if (nodeid, reason) in bad else "expected"
        terminalreporter.write_line(f"{tag}: {nodeid}: {reason}")
    if bad:
        terminalreporter.write_line("unexpected skips fail the run: install what they need, or set "
                                    "SPADE_ALLOW_SKIPS (see tests/conftest.py)")


def pytest_sessionfinish(session, exitstatus):
    if _unexpected() and exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
