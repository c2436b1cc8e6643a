"""The README's GPU commands, checked without a GPU: every row of its table (model, setting,
config file, TP, memory flags, card) resolves its preset and passes train.py's start-up checks (TP
divides the processes of the config file; one rank's share of the shipped weights, counted on the
meta device, fits within vLLM's share of the named card), and every `accelerate launch` line of
the README is a row of that table. (Whether the whole run fits the card is the memory preflight's
to say: tests/test_preflight.py.)"""
import re
import shlex

import pytest
import yaml

from infra import config
from infra import preflight
from infra import models
from gpu_table import README, ROOT, table_rows

# total memory as the driver reports it (nvidia-smi: 81,559 MiB and 143,771 MiB)
CARD_BYTES = {"H100 80 GB": 81559 * 2**20, "H200 141 GB": 143771 * 2**20}
# the flags a row names: the memory flags and LoRA's rank (its runs are planned apart)
MEMORY_FLAGS = ("--offload_trainer", "--gpu_memory_utilization", "--lora_rank")


def memory_flags(args: list[str]) -> str:
    """The flags of a command's train.py arguments a row names (MEMORY_FLAGS), as it writes
    them."""
    out = []
    for i, a in enumerate(args):
        if a == "--offload_trainer":
            out.append(a)
        elif a in MEMORY_FLAGS:
            out += [a, args[i + 1]]
    return " ".join(out)


def launch_lines() -> list[list[str]]:
    """Every `accelerate launch ... train.py ...` command of the README, as argument lists."""
    return [shlex.split(line) for line in README.splitlines()
            if re.match(r"accelerate launch .*train\.py", line)]


def test_the_table_lists_every_paper_model_and_setting():
    rows = table_rows()
    assert {(r[0], r[1]) for r in rows} == {(m, s) for m in models.MODEL_ALIASES
                                            for s in ("games", "tool")}
    assert {r[5] for r in rows} <= CARD_BYTES.keys()


def test_every_launch_command_is_a_row():
    rows = {r[:5] for r in table_rows()}
    lines = launch_lines()
    assert len(lines) >= 10
    for argv in lines:
        args = argv[argv.index("train.py") + 1:]
        flag = lambda name, default: args[args.index(name) + 1] if name in args else default
        row = (flag("--model", "tiny"), flag("--setting", "games"),
               argv[argv.index("--config_file") + 1], int(flag("--tensor_parallel_size", "1")),
               memory_flags(args))
        assert row in rows, f"README command not in the GPU table: {' '.join(argv)}"


@pytest.mark.parametrize("row", table_rows(),
                         ids=lambda r: "-".join([*r[:3], f"tp{r[3]}", *r[4].split()]))
def test_row_passes_the_start_up_checks(row):
    model, setting, config_file, tp, flags, card = row
    cfg = config.parse(["--model", model, "--setting", setting,
                        "--tensor_parallel_size", str(tp), *flags.split()], models.MODEL_ALIASES)
    margs = cfg.model
    assert cfg.loop.setting == setting and margs.tensor_parallel_size == tp
    world = yaml.safe_load((ROOT / config_file).read_text())["num_processes"]
    weights = models.parameter_count(model) * models.shipped_dtype(model).itemsize
    assert preflight.vllm_fit_error(world=world, tp=tp, weight_bytes=weights,
                                 utilization=margs.gpu_memory_utilization,
                                 card_bytes=CARD_BYTES[card]) is None, row


def test_the_30b_at_tp_1_would_not_start():
    """The command the table replaced (Qwen3-30B-A3B tool use with no TP): 56.9 GiB of weights
    against 0.35 x 79.6 GiB = 27.9 GiB on an H100."""
    weights = models.parameter_count("Qwen3-30B-A3B") * 2
    assert weights / 2**30 == pytest.approx(56.87, abs=0.01)
    error = preflight.vllm_fit_error(world=8, tp=1, weight_bytes=weights, utilization=0.35,
                                  card_bytes=CARD_BYTES["H100 80 GB"])
    assert error.endswith("27.9 GiB): use --tensor_parallel_size 4 or --gpu_memory_utilization "
                          "above 0.71")
