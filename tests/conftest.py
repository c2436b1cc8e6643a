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
