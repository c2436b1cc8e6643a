"""Benchmark: the memory preflight's measurement (preflight.measure_trainer, what `train.py
--preflight` runs once per plan) with the device-wide peak alone against MemTracker's own
bookkeeping, which after every op also updates the peak of every module it has entered, in one
process on the same inputs.

    python bench/preflight.py            # Qwen3-4B's layers, 4 of its 36, LoRA rank 16
    python bench/preflight.py --smoke    # the tiny model: seconds, shows it runs

The model is Qwen3-4B's architecture (hidden 2,560, vocabulary 151,936) cut to LAYERS decoder
layers, on fake tensors as the preflight builds it (no weights), with LoRA adapters (rank 16, on
the attention and MLP projections, as `--lora_rank 16`: peft's wrappers are most of its modules),
measuring one train.grpo_update on one sequence of LENGTH tokens, no KL term, on one GPU.

Figures (JSON lines, last): preflight.measure_time_ratio, the device peak alone over MemTracker's
own, the median over ROUNDS interleaved rounds of each arm's seconds for one measure_trainer
call (under 1: faster); preflight.max_figure_diff_gib, the largest difference between any two
matching GiB figures of the two arms' plans (0: the plan is unchanged). Never asserts.
"""
import functools
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import grpo  # noqa: E402
from infra import config, lora, models, preflight  # noqa: E402
import train  # noqa: E402

SMOKE = "--smoke" in sys.argv
LAYERS, LENGTH, ROUNDS = (2, 32, 1) if SMOKE else (4, 4096, 3)
TARGETS = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"


def architecture():
    arch = models.architecture("tiny" if SMOKE else "Qwen3-4B")
    arch.num_hidden_layers = LAYERS
    if hasattr(arch, "layer_types") and arch.layer_types:
        arch.layer_types = arch.layer_types[:LAYERS]
    return arch


def measure(arch) -> tuple[float, dict]:
    update = functools.partial(train.grpo_update, pad_id=0, temperatures={"agent": 1.0},
                               gargs=config.GRPOArgs(kl_coef=0.0, micro_batch_tokens=LENGTH))
    adapt = functools.partial(lora.add_adapters, rank=16, alpha=32.0, dropout=0.0,
                              targets=TARGETS)
    start = time.perf_counter()
    plan = preflight.measure_trainer(arch, world=1, seqs=1, seq_len=LENGTH, update=update,
                                     sample=grpo.Sample, kl=False, lora=(adapt, lora.Reference))
    return time.perf_counter() - start, plan


def figures(plan: dict) -> dict:
    """Every GiB figure of a plan, flat."""
    out = {}
    for key, value in plan.items():
        for kind, gib in (value.items() if isinstance(value, dict) else [("", value)]):
            out[f"{key}/{kind}"] = gib
    return out


def main() -> None:
    torch.set_num_threads(1)
    arch, fast_only = architecture(), preflight._global_peak_only
    times, plans = {"device_peak": [], "memtracker": []}, {}
    for _ in range(ROUNDS):
        for arm in times:
            preflight._global_peak_only = fast_only if arm == "device_peak" else (lambda t: t)
            took, plans[arm] = measure(arch)
            times[arm].append(took)
    preflight._global_peak_only = fast_only
    a, b = figures(plans["device_peak"]), figures(plans["memtracker"])
    diff = max(abs(a[k] - b[k]) for k in a) if a.keys() == b.keys() else float("inf")
    median = {arm: statistics.median(t) for arm, t in times.items()}
    print(json.dumps({"metric": "preflight.measure_time_ratio",
                      "value": round(median["device_peak"] / median["memtracker"], 4),
                      "device_peak_s": round(median["device_peak"], 2),
                      "memtracker_s": round(median["memtracker"], 2),
                      "model": f"{'tiny' if SMOKE else 'Qwen3-4B'} shape, {LAYERS} layers, "
                               f"LoRA rank 16, {LENGTH} tokens"}))
    print(json.dumps({"metric": "preflight.max_figure_diff_gib", "value": diff}))


if __name__ == "__main__":
    main()
