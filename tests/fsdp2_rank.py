"""One rank of tests/test_fsdp2.py, started by `accelerate launch --config_file
configs/fsdp2_8gpu.yaml`: train.main with a single change to Accelerate, its choice of distributed
type on CPU, plus read-only spies whose findings go to $FSDP2_TEST_OUT-rank<r>.pt (one of them
runs token_logprobs on a fixed batch, which draws no random numbers of the run's).

Accelerate picks FSDP only in its accelerator-device branch (MULTI_GPU, MULTI_NPU, ...): CPU ranks
(ACCELERATE_USE_CPU, gloo) stay MULTI_CPU and would prepare the policy with DDP. choose_fsdp_on_cpu
does what that branch does. Every later AcceleratorState() copies PartialState's shared state over
its own, so the choice is written there too; otherwise a later call would quietly go back to
MULTI_CPU. Everything else (the plugin read from the launcher's environment, fsdp2_prepare_model,
its broadcast from rank 0, checkpoints) is Accelerate's own code.
"""
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import transformers  # noqa: E402
from accelerate.state import AcceleratorState, PartialState  # noqa: E402
from accelerate.utils import DistributedType  # noqa: E402
from torch.distributed.tensor import DTensor  # noqa: E402

from infra import run  # noqa: E402
from infra import logprobs  # noqa: E402
from infra import models  # noqa: E402
import train  # noqa: E402

SEEN = {"init_timeout": None, "loaded_on_meta": [], "from_pretrained": 0}


def probe_batch(vocab: int):
    """A fixed batch for token_logprobs: 2 rows of 16 random tokens, the last 12 completion."""
    ids = torch.randint(0, vocab, (2, 16), generator=torch.Generator().manual_seed(0))
    completion = torch.zeros_like(ids)
    completion[:, 4:] = 1
    return ids, torch.ones_like(ids), completion


def choose_fsdp_on_cpu():
    real = AcceleratorState.__init__

    def init(self, *args, fsdp_plugin=None, **kwargs):
        real(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
        if fsdp_plugin is not None and self.distributed_type == DistributedType.MULTI_CPU:
            if self._mixed_precision != "no":
                fsdp_plugin.set_mixed_precision(self._mixed_precision)
            self.fsdp_plugin = fsdp_plugin
            self.distributed_type = DistributedType.FSDP
            PartialState._shared_state["distributed_type"] = DistributedType.FSDP
    AcceleratorState.__init__ = init


def spy():
    """Record the default group's timeout, every checkpoint read (from_pretrained) and whether
    each loaded model is on `meta`, and the full weights of the policy and the reference once the
    run is set up."""
    init_pg = dist.init_process_group

    def init_process_group(*args, **kwargs):
        SEEN["init_timeout"] = kwargs.get("timeout")
        return init_pg(*args, **kwargs)
    dist.init_process_group = init_process_group

    from_pretrained = transformers.PreTrainedModel.from_pretrained.__func__

    def counted(cls, *args, **kwargs):
        SEEN["from_pretrained"] += 1
        return from_pretrained(cls, *args, **kwargs)
    transformers.PreTrainedModel.from_pretrained = classmethod(counted)

    load = models.load_model_and_tokenizer

    def load_model_and_tokenizer(*args, **kwargs):
        model, tok = load(*args, **kwargs)
        SEEN["loaded_on_meta"].append(all(p.is_meta for p in model.parameters()))
        return model, tok
    models.load_model_and_tokenizer = load_model_and_tokenizer

    run_init = run.Run.__init__

    def init(self, *args, **kwargs):
        run_init(self, *args, **kwargs)
        SEEN["distributed_type"] = str(self.accelerator.distributed_type)
        SEEN["world"] = self.world
        for key, model in (("policy", self.trainer.model), ("ref", self.trainer.ref_model)):
            params = sorted(model.named_parameters())
            sharded = [isinstance(p, DTensor) for _, p in params]
            SEEN[f"{key}_sharded"] = all(sharded)
            # full_tensor() is a collective: every rank, the same order
            SEEN[key] = {n: (p.full_tensor() if s else p).detach().cpu().clone()
                         for (n, p), s in zip(params, sharded)}
            # the trainer's log-probs through the prepared model, called as train.py calls it
            ids, mask, completion = probe_batch(len(self.tokenizer))
            with torch.no_grad(), self.accelerator.autocast():
                SEEN[f"{key}_logp"] = logprobs.token_logprobs(model, ids, mask, completion).cpu()
    run.Run.__init__ = init

    finish = run.Run.finish

    def finish_spy(self):  # after the last update: which reference weights are still gathered
        SEEN["ref_gathered_at_end"] = [n for n, p in self.trainer.ref_model.named_parameters()
                                       if not isinstance(p, DTensor)]
        return finish(self)
    run.Run.finish = finish_spy


if __name__ == "__main__":
    choose_fsdp_on_cpu()
    spy()
    train.main(sys.argv[1:])
    torch.save(SEEN, f"{os.environ['FSDP2_TEST_OUT']}-rank{os.environ['RANK']}.pt")
