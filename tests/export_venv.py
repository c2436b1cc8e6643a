"""The export tests' virtualenvs and loopback servers (tests/test_export.py and
tests/test_openenv_hostile.py; test files never import each other): where the second and third
virtualenvs' interpreters are, a free local port, and a wait for a server's health."""
import json
import os
import socket
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXPORT_PYTHON = Path(os.environ.get("SPADE_EXPORT_PYTHON") or ROOT / ".venv-export" / "bin" / "python")
# verifiers' own virtualenv (.ci/run makes it from requirements/verifiers.txt): its mcp 2 cannot
# sit beside openenv 0.10's fastmcp, so it plays the export's server from a venv of its own
VERIFIERS_PYTHON = Path(os.environ.get("SPADE_VERIFIERS_PYTHON")
                        or ROOT / ".venv-verifiers" / "bin" / "python")


def export_python() -> Path:
    if not EXPORT_PYTHON.exists():
        pytest.skip(f"no export virtualenv at {EXPORT_PYTHON} (.ci/run makes it; docs/export.md)")
    return EXPORT_PYTHON


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def healthy(url: str, server, seconds: float = 120.0) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end and server.poll() is None:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as f:
                return json.loads(f.read())["status"] == "healthy"
        except OSError:
            time.sleep(0.25)
    return False
