"""Shared fixtures: tiny offline models built once per session; the hub is off for every test.

Skip policy (tests/skip_policy.py, its hooks imported here): every skip is listed with its reason,
and a skip nobody expects fails the run."""
import os
import sys
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import pytest  # noqa: E402
from skip_policy import (pytest_runtest_logreport, pytest_sessionfinish,  # noqa: E402,F401
                         pytest_terminal_summary)
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

