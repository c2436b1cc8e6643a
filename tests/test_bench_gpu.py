"""bench/gpu.py --smoke: the GPU benchmark's code runs end to end on CPU and reports every figure.

The real run needs an H200; this only keeps the script from rotting between lent GPUs. It runs
the script as a subprocess (as on the GPU machine) and reads the JSON it writes.
"""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from infra import metrics

ROOT = Path(__file__).resolve().parents[1]
FIGURES = {"gpu.logprob.peak_mem_ratio_vs_naive", "gpu.grpo_update.tokens_per_s",
           "gpu.grpo_update.peak_mem_gib", "gpu.grpo_update.held_outside_update_share",
           "gpu.sync.gather_s", "gpu.train_step.step_s"}


def _numbers(figure):
    """Every number in a figure, nested dicts included (bools are flags, not numbers)."""
    for value in figure.values():
        if isinstance(value, dict):
            yield from _numbers(value)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            yield value


@pytest.mark.slow
def test_smoke_reports_every_figure_finite(tmp_path):
    out = tmp_path / "gpu.json"
    env = {k: v for k, v in os.environ.items() if k != "OUT"}
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu.py"), "--smoke",
                           "--out", str(out)], capture_output=True, text=True, timeout=600,
                          cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["smoke"] is True
    assert {s["status"] for s in data["sections"].values()} == {"ok"}, data["sections"]
    figures = data["figures"]
    assert [f["metric"] for f in figures] and {f["metric"] for f in figures} == FIGURES
    assert len(figures) == len(FIGURES)
    for f in figures:
        assert f["value"] is not None and math.isfinite(f["value"]) and f["value"] > 0, f
        assert all(math.isfinite(x) for x in _numbers(f)), f
    # the last stdout lines are the same figures, one JSON line each, as in every bench
    tail = [json.loads(line) for line in proc.stdout.strip().splitlines()[-len(figures):]]
    assert tail == figures
    # the update ran train.grpo_update as train.py does: checkpointed, back in eval, grads freed
    update = next(f for f in figures if f["metric"] == "gpu.grpo_update.tokens_per_s")
    assert update["checkpointed_layer_calls"] > 0 and update["grads_freed"]
    assert update["training_after"] is False
    step = next(f for f in figures if f["metric"] == "gpu.train_step.step_s")
    assert {f"time/{p}_s" for p in metrics.PHASES} <= set(step)
