"""Full-size trainer measurements shared by the tests that plan the same run (tests/test_preflight.py
and tests/test_memory_order.py; test files never import each other): preflight.measure_trainer
builds the model on fake tensors, tens of seconds of CPU for a 30B model, and the Qwen3-30B-A3B
games plan at 8 ranks was measured three times (preflight's command, its direct check, the
ledger's rows). Each distinct measurement is made once per session."""
import contextlib

import pytest

from infra import preflight

_MEASURE = preflight.measure_trainer
_MEASURED: dict = {}


def measure_trainer(config, *, world: int, seqs: int, seq_len: int, update, sample, kl: bool,
                    checkpointing: bool = True, fused: bool = True, lora=None) -> dict:
    """preflight.measure_trainer, once per set of inputs that moves its figures: the model, the
    ranks, the sequences, the KL reference, checkpointing, the optimizer's kernel, LoRA's
    adapters (train.py binds their rank, alpha, dropout and targets into `lora`'s partial), and
    of the update's settings the micro-batch budget and the epochs (its temperatures and clip
    bounds move no byte). The result is shared: treat it as read-only."""
    gargs = update.keywords["gargs"]
    adapters = None if lora is None else (lora[0].args, sorted(lora[0].keywords.items()), lora[1])
    key = (config.to_json_string(), world, seqs, seq_len, kl, checkpointing, fused,
           gargs.micro_batch_tokens, gargs.ppo_epochs, repr(adapters))
    if key not in _MEASURED:
        _MEASURED[key] = _MEASURE(config, world=world, seqs=seqs, seq_len=seq_len,
                                  update=update, sample=sample, kl=kl,
                                  checkpointing=checkpointing, fused=fused, lora=lora)
    return _MEASURED[key]


@contextlib.contextmanager
def shared():
    """Within it, every preflight.measure_trainer call (train.py --preflight's, preflight.plan's)
    is measure_trainer above."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(preflight, "measure_trainer", measure_trainer)
        yield
