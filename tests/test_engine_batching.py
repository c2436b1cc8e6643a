"""The transformers engine at scale: batches by length under a token budget, FSDP2 (gloo on CPU)
at world size 1 and 2 with synchronised decoding, and its streams (engine.barrier)."""
import copy
import datetime
import pickle
import socket

import pytest
import torch

from infra import models
from infra.engine import TransformersEngine
from infra.stream import Completion

GREEDY = dict(temperature=0.0, top_p=1.0, top_k=0)


def prefill_shapes(model):
    """Record (rows, columns, padded columns) of every forward's attention mask."""
    seen = []

    def hook(module, args, kwargs):
        attn = kwargs["attention_mask"]
        seen.append((attn.shape[0], attn.shape[1], int((attn == 0).sum())))
    return seen, model.register_forward_pre_hook(hook, with_kwargs=True)


def test_batches_hand_computed(tiny):
    model, tok = tiny
    eng = TransformersEngine(model, tok, max_batch_tokens=12)
    # lengths 3, 1, 2, 10 with caps 2: [1] 1x3, [1, 2] 2x4 = 8, + [0] 3x5 = 15 > 12 -> new batch
    assert eng._batches([[0] * 3, [0], [0] * 2, [0] * 10], [2] * 4) == [[1, 2], [0], [3]]
    # the largest cap counts for the whole batch: 2 x (2 + 9) = 22 > 12
    assert eng._batches([[0], [0] * 2], [2, 9]) == [[0], [1]]


def test_one_prompt_20x_longer_pads_only_itself(tiny, capsys):
    model, tok = tiny
    short = [tok.encode(f"game {i}: go north")[:10] for i in range(8)]
    short = [p + [p[-1]] * (10 - len(p)) for p in short]                      # 8 x 10 tokens
    prompts = short[:4] + [(short[0] * 20)[:200]] + short[4:]                 # one of 200 tokens
    cap, budget = 8, 256
    reference = [TransformersEngine(model, tok).generate([p], max_new_tokens=cap, **GREEDY)[0]
                 for p in prompts]
    for max_batch_tokens, pad_bound in ((budget, 0), (10 ** 6, 8 * 190)):
        seen, hook = prefill_shapes(model)
        try:
            outs = TransformersEngine(model, tok, max_batch_tokens=max_batch_tokens,
                                      progress=True).generate(prompts, max_new_tokens=cap,
                                                              **GREEDY)
        finally:
            hook.remove()
        assert [o.token_ids for o in outs] == [o.token_ids for o in reference]  # order kept
        padding = sum(pad for rows, cols, pad in seen if cols in (10, 200))  # the prefills
        assert padding == pad_bound  # no batching: 8 short rows padded to 200 tokens
        if max_batch_tokens == budget:
            # bounded memory: every step's batch holds at most budget tokens of KV
            assert max(rows * cols for rows, cols, _ in seen if rows > 1) <= budget
            assert sorted({rows for rows, cols, _ in seen if cols in (10, 200)}) == [1, 8]
    err = capsys.readouterr().err
    assert "generate" in err and "0/2 [" in err and "0/1 [" in err  # a bar counting batches


# ----------------------------------------------------------------------------------------------
# FSDP2 on CPU (gloo)


def shard(model, mesh):
    from torch.distributed.fsdp import fully_shard
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def train_step(model, tok):
    """One optimizer step on a fixed sequence: what the next GRPO update does after sampling."""
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    ids = torch.tensor([tok.encode("a training sequence after sampling")])
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss.item()


def test_fsdp2_world_size_1_samples_then_trains(tiny, tmp_path):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    if dist.is_initialized():
        pytest.skip("a process group already exists in this process")
    model, tok = tiny
    prompts = [tok.encode("first"), tok.encode("a somewhat longer second prompt")]
    expected = TransformersEngine(model, tok).generate(prompts, max_new_tokens=6, **GREEDY)
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0,
                            world_size=1)
    try:
        sharded = shard(copy.deepcopy(model), init_device_mesh("cpu", (1,)))
        eng = TransformersEngine(sharded, tok, prefix_cache_bytes=1 << 30)
        assert not eng.synced  # one rank: nothing to keep in step
        outs = eng.generate(prompts, max_new_tokens=6, **GREEDY)
        assert [o.token_ids for o in outs] == [o.token_ids for o in expected]
        assert outs[0].logprobs == pytest.approx(expected[0].logprobs, abs=1e-5)
        before = train_step(sharded, tok)  # no "Inference tensors do not track version counter"
        assert train_step(sharded, tok) < before
        eng.sync_weights(sharded)
        assert len(eng.generate(prompts, max_new_tokens=3, **GREEDY)) == 2
    finally:
        dist.destroy_process_group()


def _fsdp_worker(rank, port, out_dir):
    """One of two FSDP2 ranks: different numbers of generate calls, prompts and caps per rank,
    then drain() and a training step on both."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=120))  # a missed vote fails, not hangs
    model, tok = models.build_tiny("tiny", seed=0)
    plain = TransformersEngine(model, tok)
    calls = [[["a first game"], ["b"], ["c", "a longer prompt for rank zero"]],
             [["one prompt on rank one, long enough to decode for longer"]]][rank]
    caps = [[4, 3, 9], [12]][rank]
    expected = [[o.token_ids for o in plain.generate([tok.encode(t) for t in ps],
                                                     max_new_tokens=c, **GREEDY)]
                for ps, c in zip(calls, caps)]
    eng = TransformersEngine(shard(copy.deepcopy(model), init_device_mesh("cpu", (2,))), tok,
                             max_batch_tokens=16)
    got = [[o.token_ids for o in eng.generate([tok.encode(t) for t in ps], max_new_tokens=c,
                                              **GREEDY)] for ps, c in zip(calls, caps)]
    eng.drain()
    loss = train_step(eng.model, tok)
    with open(f"{out_dir}/rank{rank}.pkl", "wb") as f:
        pickle.dump({"synced": eng.synced, "got": got, "expected": expected, "loss": loss}, f)
    dist.destroy_process_group()


@pytest.mark.slow
def test_fsdp2_two_ranks_decode_in_lockstep(tmp_path):
    """Ranks with different work neither deadlock nor diverge: each gets the plain model's
    greedy tokens, and both then train."""
    import torch.multiprocessing as mp
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(_fsdp_worker, args=(port, str(tmp_path)), nprocs=2, join=True,
                       start_method="spawn")
    for r in (0, 1):
        out = pickle.loads((tmp_path / f"rank{r}.pkl").read_bytes())
        assert out["synced"] and out["got"] == out["expected"] and out["loss"] > 0


def test_an_engines_barrier_binds_its_sampling_and_seeds_its_kth_call_seed_k():
    """engine.barrier (TransformersEngine's streams): stream.Batched over the engine's generate,
    with the role's sampling bound and the k-th generate call seeded seed(k); a request's own cap,
    or the stream's, goes in as max_new_tokens, and serve is the engine's."""
    from infra import engine

    class Recording:
        def __init__(self):
            self.calls, self.served = [], 0

        def generate(self, prompts, *, max_new_tokens, seed, **sampling):
            self.calls.append((prompts, max_new_tokens, seed, sampling))
            return [Completion([1], [0.0], "x", "stop") for _ in prompts]

        def serve(self, fn):
            self.served += 1
            return fn()

    rec = Recording()
    stream = engine.barrier(rec, dict(temperature=0.5, top_k=3), seed=lambda k: 100 + k,
                            max_new_tokens=7, render=lambda chat: [len(chat)])
    stream.submit((1, 1), "ab")
    stream.submit((0, 1), "a", max_new_tokens=3)
    assert [key for key, _ in stream.collect()] == [(0, 1), (1, 1)]
    stream.submit((0, 2), "abc")
    stream.collect()
    sampling = {"temperature": 0.5, "top_k": 3}
    assert rec.calls == [([[1], [2]], [3, 7], 101, sampling), ([[3]], 7, 102, sampling)]
    assert stream.serve(lambda: 42) == 42 and rec.served == 1
