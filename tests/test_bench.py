"""Every benchmark in bench/ still runs: each at its smoke size (`--smoke`: the same code on tiny
shapes, seconds), checked only for exiting cleanly and printing its JSON figure lines as its last
lines. The figures themselves are never asserted (a benchmark's numbers depend on the machine).

Three scripts are covered differently, for want of what they measure: bench/gpu.py needs a GPU
(tests/test_bench_gpu.py runs its own --smoke), bench/acebench_upstream.py needs an ACEBench
checkout and its imports (openai, python-dotenv), so here it only has to import and print its
usage, and bench/designer_learns.py is an experiment of minutes per arm whose shorter version is
tests/test_designer_learns.py.
The CPU benchmarks run at once, as separate processes (about a minute of wall time on 2 shared
cores); the vLLM ones have their own test (vLLM's start-up alone is most of a minute).
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIGURES = {  # bench -> the metric names of its JSON figure lines, in order
    "step.py": ["step.overhead_share"],
    "rollout.py": ["rollout.batched_turn_speedup", "weightsync.name_map_ms",
                   "rollout.generate_time_ratio_vs_transformers"],
    "logprob.py": ["logprob.peak_mem_ratio_vs_naive", "logprob.max_abs_err"],
    "sandbox.py": ["sandbox.episodes_per_s_ratio_vs_spawn", "sandbox.step_rtt_ratio_vs_pipe",
                   "sandbox.episode_start_ms_p50", "sandbox.timeout_overrun_ms_p95",
                   "sandbox.validations_per_s"],
    "offload.py": ["offload.round_trip_gbps_ratio_vs_plain_copy"],
    "lora.py": ["lora.update_tokens_per_s_ratio", "lora.peak_mem_ratio", "lora.sync_bytes_ratio"],
    "preflight.py": ["preflight.measure_time_ratio", "preflight.max_figure_diff_gib"],
    "vllm_rollout.py": ["vllm.generation_speedup", "vllm.sync_ms_per_mparam",
                        "vllm.sync_s_per_bparam_tp1", "vllm.sync_s_per_bparam_tp2",
                        "vllm.sync_tp2_over_tp1", "vllm.seeded_over_unseeded_time"],
    "turn_barrier.py": ["rollout.engine_step_occupancy", "rollout.episodes_per_s_ratio_vs_barrier",
                        "designer.round_speedup_vs_rounds"],
}
VLLM_BENCHES = ("vllm_rollout.py", "turn_barrier.py")
COVERED_ELSEWHERE = {"gpu.py", "acebench_upstream.py", "designer_learns.py"}


def start(script: str, *args: str) -> subprocess.Popen:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    return subprocess.Popen([sys.executable, str(ROOT / "bench" / script), *args], cwd=ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def figures_of(script: str, proc: subprocess.Popen) -> list[str]:
    """The metric names of the JSON lines that end the script's output (fails on a crash)."""
    out, err = proc.communicate(timeout=400)
    assert proc.returncode == 0, f"bench/{script} exited {proc.returncode}:\n{err[-3000:]}"
    names = []
    for line in reversed(out.strip().splitlines()):
        try:
            row = json.loads(line)
        except ValueError:
            break
        names.insert(0, row["metric"])
        assert isinstance(row["value"], (int, float)), (script, row)
    return names


def test_every_benchmark_is_covered():
    scripts = {p.name for p in (ROOT / "bench").glob("*.py")}
    assert scripts == set(FIGURES) | COVERED_ELSEWHERE


@pytest.mark.slow
def test_cpu_benchmarks_run_at_smoke_size_and_print_their_figures():
    procs = {s: start(s, "--smoke") for s in FIGURES if s not in VLLM_BENCHES}
    usage = start("acebench_upstream.py")
    try:
        got = {s: figures_of(s, p) for s, p in procs.items()}
        _, doc = usage.communicate(timeout=60)
    finally:
        for p in [*procs.values(), usage]:
            if p.poll() is None:
                p.kill()
    assert got == {s: FIGURES[s] for s in procs}
    assert usage.returncode == 1 and "git clone https://github.com/ACEBench/ACEBench" in doc


@pytest.mark.slow
@pytest.mark.needs_vllm
@pytest.mark.parametrize("script", VLLM_BENCHES)
def test_vllm_benchmark_runs_at_smoke_size_and_prints_its_figures(script):
    proc = start(script, "--smoke")
    try:
        assert figures_of(script, proc) == FIGURES[script]
    finally:
        if proc.poll() is None:
            proc.kill()
