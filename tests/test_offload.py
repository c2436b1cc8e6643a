"""offload.TrainerOffload: the trainer's parameters and AdamW state leave the device while vLLM
generates and come back bit for bit; a run with offload on ends where a run without it ends."""
import copy
import types

import pytest
import torch

from infra import config
from infra import offload
import grpo
import train


def _samples(step, n=12):
    return [grpo.Sample([5 + i + step] * n, [0] * 4 + [1] * (n - 4), [-7.0] * n, advantage=a,
                        role="agent", weight=1.0) for i, a in enumerate([1.0, -1.0, 0.5])]


def _state(model, opt):
    return ([p.detach().clone() for p in model.parameters()],
            [v.clone() for s in opt.state.values() for v in s.values()])


def _three_steps(tiny, offloaded: bool):
    """Three grpo_update steps on the tiny model; with offload the state is away (its storages
    empty) during every step's rollout phase, as train.train does around the play phase."""
    from accelerate import Accelerator
    model = copy.deepcopy(tiny[0]).eval()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
    off = offload.TrainerOffload(model, opt, enabled=offloaded)
    freed = []
    for step in range(3):
        freed.append(off.offload())
        if offloaded:  # the rollout: nothing of the trainer's state occupies memory
            assert all(p.untyped_storage().nbytes() == 0 for p in model.parameters())
            assert all(v.untyped_storage().nbytes() == 0
                       for s in opt.state.values() for v in s.values())
            junk = torch.randn(sum(p.numel() for p in model.parameters()))  # reuse the memory
            del junk
        off.reload(optimizer=False)  # as train.train: the moments come back at the step
        if offloaded and step > 0:  # the forward and backward run without them
            assert all(v.untyped_storage().nbytes() == 0
                       for s in opt.state.values() for v in s.values())
            assert all(p.untyped_storage().nbytes() > 0 for p in model.parameters())
        train.grpo_update(train.Trainer(model, opt, sched, Accelerator(cpu=True)), _samples(step),
                          pad_id=tiny[1].pad_token_id, temperatures={"agent": 1.0},
                          gargs=config.GRPOArgs(kl_coef=0.0))
    return _state(model, opt), freed


def test_offload_on_and_off_end_with_identical_weights_and_optimizer_state(tiny):
    (params_on, opt_on), freed = _three_steps(tiny, offloaded=True)
    (params_off, opt_off), freed_off = _three_steps(tiny, offloaded=False)
    assert all(torch.equal(a, b) for a, b in zip(params_on, params_off))
    assert len(opt_on) == len(opt_off) > 0
    assert all(torch.equal(a, b) for a, b in zip(opt_on, opt_off))
    params = sum(p.numel() * p.element_size() for p in tiny[0].parameters())
    # step 0: the fp32 parameters (AdamW's state does not exist yet); then 3 x (m, v, step)
    assert freed[0] == params
    assert freed[1] == freed[2] == 3 * params + 4 * len(list(tiny[0].parameters()))
    assert freed_off == [0, 0, 0]


def test_a_storage_shared_by_views_goes_once_and_comes_back_whole():
    base = torch.nn.Parameter(torch.arange(8.0))
    model = torch.nn.Module()
    model.a = torch.nn.Parameter(base.detach()[:4])  # two parameters viewing one storage,
    model.b = torch.nn.Parameter(base.detach()[4:])  # as FSDP2's padded shards do
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    off = offload.TrainerOffload(model, opt)
    assert off.offload() == 8 * 4
    assert off.offload() == 0  # already away: a second call is a no-op
    assert off.reload() == 8 * 4
    assert model.a.tolist() == [0, 1, 2, 3] and model.b.tolist() == [4, 5, 6, 7]


def test_disabled_offload_leaves_everything_in_place():
    model = torch.nn.Linear(3, 2)
    off = offload.TrainerOffload(model, torch.optim.SGD(model.parameters(), lr=0.1),
                                 enabled=False)
    assert off.offload() == 0 and off.reload() == 0
    assert model.weight.untyped_storage().nbytes() == 6 * 4


def test_offload_needs_the_vllm_engine(tmp_path):
    """The transformers engine generates with the trainer's own weights: offloading them would
    leave it nothing to generate with, so the run refuses at start-up in one line."""
    flags = ["--model", "tiny", "--steps", "1", "--sandbox_workers", "1", "--offload_trainer",
             "--engine", "transformers", "--output_dir", str(tmp_path / "run")]
    with pytest.raises(SystemExit, match="--offload_trainer needs the vLLM engine"):
        train.main(flags)


@pytest.mark.slow
def test_the_loop_offloads_for_the_rollouts_and_reloads_around_the_update(tmp_path, monkeypatch):
    """train.train's wiring: each step starts by offloading (the designer and the plays run on
    vLLM), brings the parameters back before the update, the moments with the optimizer's step
    (offload.py's hook), and everything before the weight sync and the checkpoint."""
    calls = []

    class Recorder(offload.TrainerOffload):
        def offload(self):
            calls.append("offload")
            return 0

        def reload(self, optimizer=True):
            calls.append(f"reload(optimizer={optimizer})")
            return 0
    monkeypatch.setattr(offload, "TrainerOffload", Recorder)
    update = train.grpo_update

    def spy(*a, **k):
        calls.append("update")
        return update(*a, **k)
    monkeypatch.setattr(train, "grpo_update", spy)
    corpus = str(train.HERE / "data" / "corpus.jsonl")
    train.main(["--model", "tiny", "--steps", "2", "--regen_interval", "2", "--num_envs", "2",
                "--skills_per_regen", "1", "--plays", "2", "--hint_plays", "1",
                "--max_attempts", "1", "--designer_max_tokens", "16", "--hint_max_tokens", "8",
                "--max_turns", "1", "--max_new_tokens", "8", "--sandbox_workers", "1",
                "--corpus", corpus, "--output_dir", str(tmp_path / "run")])
    step = ["offload", "reload(optimizer=False)", "update", "reload(optimizer=True)"]
    assert calls == step * 2 + ["reload(optimizer=True)"]  # the export's (finish)


def test_arena_layout_hand_computed():
    """Slots in order, each on a 512-byte boundary; the arena holds exactly the padded slots."""
    assert offload.arena_layout([3, 512, 513, 8]) == ([0, 512, 1024, 2048], 2560)
    assert offload.arena_layout([]) == ([], 0)
    assert offload.arena_layout([5, 5], align=4) == ([0, 8], 16)


def _tiny_with_moments(tiny):
    """The tiny model with AdamW's state after one step (so the offload carries the moments)."""
    model = copy.deepcopy(tiny[0])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return model, opt


def test_one_arena_of_exactly_the_bytes_it_holds_and_the_plan_counts_them(tiny):
    """The host copies are views into one buffer laid out by arena_layout (not one rounded-up
    buffer per storage). It is allocated (on CUDA: registered, every page faulted in) once, at the
    first offload, before AdamW's moments exist, sized for them too from the parameters' shapes:
    the moments that appear at the first step fill it exactly, with no second arena. Its bytes are
    the plan's 12 per parameter (preflight.host_ram) plus the step counters and the alignment, a
    slot each at most."""
    from infra import preflight
    model = copy.deepcopy(tiny[0])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    off = offload.TrainerOffload(model, opt)
    params = [p.untyped_storage().nbytes() for p in model.parameters()]
    assert off.state_to_come() == [b for n in params for b in (4, n, n)]
    off.offload()  # the parameters alone are away; the arena has room for the moments
    arena = off.arena
    assert arena.nbytes == offload.arena_layout(params + off.state_to_come())[1]
    off.reload()
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    opt.step()  # the moments appear
    opt.zero_grad(set_to_none=True)
    assert off.state_to_come() == []
    before = [v.clone() for s in opt.state.values() for v in s.values()]
    sizes = [s.nbytes() for s, _ in off._storages()]
    off.offload()
    assert off.arena is arena  # the same arena, exactly as large as what it now holds
    assert arena.nbytes == offload.arena_layout(sizes)[1] and len(sizes) == 4 * len(params)
    off.reload()
    assert all(torch.equal(a, b) for a, b in
               zip(before, [v for s in opt.state.values() for v in s.values()]))
    n = sum(p.numel() for p in model.parameters())
    planned = preflight.host_ram(n, world=1, tp=1, sleep_level=2, offload=True)["offload"]
    assert planned * 1e9 == 12 * n
    assert 12 * n <= arena.nbytes <= 12 * n + len(sizes) * offload.ALIGN


def test_state_larger_than_the_arena_gets_a_new_one(tiny):
    """An optimizer whose state offload.py cannot foresee (SGD with momentum): the arena is sized
    for the parameters, then replaced, once, when the momentum buffers appear."""
    model = copy.deepcopy(tiny[0])
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    off = offload.TrainerOffload(model, opt)
    assert off.state_to_come() == []
    off.offload()
    first = off.arena
    off.reload()
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    opt.step()
    before = [p.detach().clone() for p in model.parameters()]
    off.offload()
    assert off.arena is not first
    second = off.arena
    off.reload()
    off.offload()
    assert off.arena is second
    off.reload()
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_pin_registers_exactly_the_arenas_bytes(monkeypatch):
    """CUDA's pinned allocator would round a 192 MiB buffer up to 256 MiB: the arena is pinned in
    place instead, its exact bytes registered with the driver (here a recording stand-in)."""
    calls = []
    cudart = types.SimpleNamespace(
        cudaHostRegister=lambda ptr, n, flags: calls.append(("register", ptr, n, flags)) or 0,
        cudaHostUnregister=lambda ptr: calls.append(("unregister", ptr)) or 0)
    monkeypatch.setattr(torch.cuda, "cudart", lambda: cudart)
    buffer = torch.empty(192 * 2**20 + 3, dtype=torch.uint8)
    offload.pin(buffer)
    offload.unpin(buffer)
    assert calls == [("register", buffer.data_ptr(), 192 * 2**20 + 3, 0),
                     ("unregister", buffer.data_ptr())]
    cudart.cudaHostRegister = lambda *a: 2  # cudaErrorMemoryAllocation
    with pytest.raises(RuntimeError, match="cudaHostRegister .* failed"):
        offload.pin(buffer)


def test_freed_storage_goes_back_to_the_driver_after_the_offload(tiny, monkeypatch):
    """vLLM's KV cache maps its own pool: the offload hands torch's cached blocks back (on CUDA,
    empty_cache) once every storage is freed, not before."""
    model, opt = _tiny_with_moments(tiny)
    seen = []
    monkeypatch.setattr(offload, "release_cached", lambda device: seen.append(
        (device.type, sum(p.untyped_storage().nbytes() for p in model.parameters()))))
    offload.TrainerOffload(model, opt).offload()
    assert seen == [("cpu", 0)]
    emptied = []
    monkeypatch.undo()
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(1))
    offload.release_cached(torch.device("cpu"))
    assert emptied == []
    offload.release_cached(torch.device("cuda"))
    assert emptied == [1]


def test_resident_reports_the_state_on_the_device_by_kind(tiny):
    """What the memory ledger reads (tests/test_memory_order.py): parameters, gradients and
    moments on the device at each point of a step, each storage once."""
    model, opt = _tiny_with_moments(tiny)
    off = offload.TrainerOffload(model, opt)
    n = sum(p.untyped_storage().nbytes() for p in model.parameters())
    steps = 4 * len(list(model.parameters()))  # AdamW's step counters
    assert off.resident() == {"params": n, "grads": 0, "moments": 2 * n + steps, "reference": 0}
    off.offload()
    assert off.resident() == {"params": 0, "grads": 0, "moments": 0, "reference": 0}
    off.reload(optimizer=False)
    assert off.resident() == {"params": n, "grads": 0, "moments": 0, "reference": 0}
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    assert off.resident() == {"params": n, "grads": n, "moments": 0, "reference": 0}
    opt.step()  # the pre-hook brings the moments back first
    assert off.resident() == {"params": n, "grads": n, "moments": 2 * n + steps, "reference": 0}
    assert offload.TrainerOffload(model, opt, enabled=False).resident()["params"] == n


def test_the_kl_reference_goes_with_the_trainer_and_comes_back_for_the_update(tiny):
    """The frozen bf16 reference is read only by the update: it waits in host RAM with the
    parameters during the rollouts and comes back with them (reload(optimizer=False)), bit for
    bit, before the update's forward."""
    model, opt = _tiny_with_moments(tiny)
    ref = copy.deepcopy(tiny[0]).to(torch.bfloat16).requires_grad_(False)
    before = [p.clone() for p in ref.parameters()]
    off = offload.TrainerOffload(model, opt, reference=ref)
    n = sum(p.untyped_storage().nbytes() for p in ref.parameters())
    assert off.resident()["reference"] == n
    freed = off.offload()
    assert off.resident()["reference"] == 0 and freed >= n
    assert all(p.untyped_storage().nbytes() == 0 for p in ref.parameters())
    off.reload(optimizer=False)  # the update's start: parameters and reference, no moments
    assert off.resident()["reference"] == n and off.resident()["moments"] == 0
    assert all(torch.equal(a, b) for a, b in zip(before, ref.parameters()))
    off.reload()


def test_state_loaded_from_a_checkpoint_offloads_too(tiny):
    """torch.load gives CPU tensors storage it cannot resize (what Accelerate's load_state leaves
    in the optimizer on a CPU resume): each gets storage of its own, the same tensor object, and
    the round trip is exact."""
    import io
    model, opt = _tiny_with_moments(tiny)
    saved = io.BytesIO()
    torch.save(opt.state_dict(), saved)
    saved.seek(0)
    opt.load_state_dict(torch.load(saved))
    moments = [v for s in opt.state.values() for v in s.values()]
    assert not all(v.untyped_storage().resizable() for v in moments)
    before = [v.clone() for v in moments]
    off = offload.TrainerOffload(model, opt)
    off.offload()
    off.reload()
    after = [v for s in opt.state.values() for v in s.values()]
    assert all(a is b for a, b in zip(after, moments))
    assert all(torch.equal(a, b) for a, b in zip(after, before))
