"""train.py end to end on the tiny models (every test here is a run: marked slow): regeneration,
hinted arm, designer + agent updates, memory, checkpoints, exact resume after a crash in every
phase, tiny-MoE, tool use with KL, a bf16 local model, data parallel and tensor parallel ranks,
and eval.py over the exports. The loop's pure functions and its fail-fast checks are in
tests/test_train.py; the ablation runs, each checked for its effect, in tests/test_wiring.py."""
import json
from pathlib import Path

import pytest
import torch

from infra import vllm_engine
from infra import run
from infra import logprobs as logprobs_lib
from infra import metrics as metrics_lib
from infra import models
import train
from fake_vllm import FakeTPLLM
from runs import BASE, coin_script, count_checkpoints, metrics
from scripted import main_with

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def designer_model():
    return models.build_tiny("tiny", seed=0)


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory, designer_model):
    """One uninterrupted run, shared by the end-to-end checks and the resume comparisons."""
    return main_with(coin_script(*designer_model), BASE + ["--output_dir", str(tmp_path_factory.mktemp("ref") / "run"), "--export_every", "2",
                              "--keep_checkpoints", "all"])


def test_end_to_end_with_scripted_designer(reference_run):
    run = reference_run
    rows = metrics(run)
    assert [r["charts/step"] for r in rows] == [0, 1, 2]
    # regeneration at step 0: valid scripted envs accepted, broken / hostile ones rejected
    assert rows[0]["designer/attempts"] >= 2 and rows[0]["designer/accepted"] >= 1
    assert 0 < rows[0]["designer/validity_rate"] <= 1
    assert "regret/mean" in rows[0] and "agent/hinted_return_mean" in rows[0]
    # step 2 regenerates again and trains step 0's designer samples (delay R = 2)
    assert rows[2]["designer/samples"] >= 2 and 0 < rows[2]["designer/score_mean"] < 1
    assert all(r["losses/samples"] > 0 and r["losses/grad_norm"] > 0 for r in rows)
    assert 0 < rows[0]["agent/return_mean"] < 1 and rows[0]["env/zero_variance_share"] < 1
    mem = json.loads((run / "memory.json").read_text())
    assert mem["records"] and {"win_rate", "regret", "skill"} <= set(mem["records"][0])
    assert (run / "latest").read_text().strip() == "checkpoint-3"
    assert sorted(p.name for p in run.glob("checkpoint-*")) == ["checkpoint-1", "checkpoint-2", "checkpoint-3"]
    assert sorted(p.name for p in (run / "exports").iterdir()) == ["step-2", "step-3"]  # every 2 steps and the end
    assert list((run / "envs").glob("step-0000-rank-0/*.py")) and list((run / "transcripts").glob("*.jsonl"))
    attempts = [json.loads(l) for l in (run / "designer" / "step-0000-rank-0.jsonl").read_text().splitlines()]
    assert [a["ok"] for a in attempts].count(False) >= 1
    assert {a["reason"] for a in attempts if not a["ok"]} <= {"syntax", "timeout"}
    # the final policy loads like any Hugging Face model (eval.py --model <run>/final_model)
    model, tok = models.load_model_and_tokenizer(str(run / "final_model"), dtype=torch.float32)
    assert type(model).__name__ == "Qwen3ForCausalLM" and tok.chat_template
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                   add_generation_prompt=True).endswith("<|im_start|>assistant\n")


def test_tiny_moe_runs(tmp_path):
    args = [a if a != "tiny" else "tiny-moe" for a in BASE]
    run = train.main(args + ["--steps", "1", "--output_dir", str(tmp_path / "moe")])
    rows = metrics(run)
    assert len(rows) == 1 and rows[0]["losses/samples"] > 0
    # the update reached the MoE layers: the exported router and expert weights moved away from
    # the initial ones (same seed), and the export is still a Qwen3-MoE
    from transformers import AutoModelForCausalLM
    init, _ = models.build_tiny("tiny-moe", seed=0)
    final = AutoModelForCausalLM.from_pretrained(Path(run) / "final_model")
    assert type(final).__name__ == "Qwen3MoeForCausalLM"
    before, after = dict(init.named_parameters()), dict(final.named_parameters())
    moved = {n for n in before if not torch.equal(before[n], after[n])}
    assert any(".mlp.gate." in n for n in moved), "no router weight was trained"
    assert any(".mlp.experts." in n for n in moved), "no expert weight was trained"


@pytest.mark.parametrize("phase", [*metrics_lib.PHASES, "log"])
def test_resume_after_crash_is_exact(tmp_path, monkeypatch, designer_model, reference_run, phase):
    crash_step = 2 if phase == "regenerate" else 1
    entered = []  # one entry per step that reached the phase

    def crash(name, times):
        if name == phase:
            entered.append(name)
            if len(entered) == crash_step + 1:
                raise RuntimeError("simulated kill")
        enter(name, times)

    # one scripted designer across the kill, as a real engine's output depends only on its seed
    engines = coin_script(*designer_model)
    enter = train.phase
    monkeypatch.setattr(train, "phase", crash)
    with pytest.raises(RuntimeError, match="simulated kill"):
        main_with(engines, BASE + ["--output_dir", str(tmp_path / "b")])
    monkeypatch.setattr(train, "phase", enter)
    resumed = main_with(engines, BASE + ["--output_dir", str(tmp_path / "b"), "--resume"])
    assert metrics(resumed) == metrics(reference_run)


def test_tool_setting_runs_with_kl(tmp_path):
    """Tool use: R = 8, six tool skills, KL 0.005 to a frozen reference; hand-written ToolEnvs."""
    i = BASE.index("--regen_interval")
    args = BASE[:i] + BASE[i + 2:]  # the setting's own R
    # a random tiny model never ends an episode, so the compact filter (on in tool use) would mask
    # every agent sample and nothing would be forwarded: this run checks the KL path without it
    run = train.main(args + ["--setting", "tool", "--steps", "1", "--skills_per_regen", "6",
                             "--num_envs", "2", "--no_tool_filters", "--output_dir", str(tmp_path / "tool")])
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["regen_interval"] == 8 and cfg["kl_coef"] == 0.005
    rows = metrics(run)
    assert rows[0]["env/from_fallback"] == 2 and rows[0]["losses/samples"] > 0
    assert "losses/kl" in rows[0]
    pool = json.loads(next((run / "envs").glob("step-0000-rank-0/pool.json")).read_text())
    assert {p["env_id"] for p in pool} == {"fallback:tool_retail_orders", "fallback:tool_smart_home"}


def test_two_processes_data_parallel(tmp_path):
    """Two CPU ranks (gloo): each designs and plays its own share of the N slots; designer
    scores, memory records and metrics are gathered; every collective matches across ranks."""
    import os
    import subprocess
    import sys
    out = tmp_path / "ddp"
    env = dict(os.environ, ACCELERATE_USE_CPU="true", OMP_NUM_THREADS="1")
    # --standalone: the launcher's own rendezvous on a port the OS picks (no bind-close-reuse race)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
           "--standalone", str(Path(train.__file__)), *BASE, "--num_envs", "4",
           "--plays", "2", "--output_dir", str(out)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = metrics(out)
    assert [r["charts/step"] for r in rows] == [0, 1, 2]
    assert all(r["designer/slots"] == 2 for r in rows if "designer/slots" in r)  # 4 slots / 2 ranks
    assert {p.name for p in (out / "envs").iterdir()} >= {"step-0000-rank-0", "step-0000-rank-1"}
    assert (out / "checkpoint-3" / "spade_state-1.json").exists()


def test_checkpoint_sweep_evaluates_every_export(reference_run, tmp_path):
    """eval.py --checkpoints on a tiny run: each export loaded and evaluated, one row each, a CSV of
    the trajectories, and the best export named; first through the real engine, then with scripted
    replies that are right only once the second export's weights are loaded."""
    import csv

    import eval as E
    from suites import table1 as T1
    from scripted import ScriptedSampler
    flags = ["--checkpoints", str(reference_run), "--engine", "transformers", "--suites", "reasoning_gym",
             "--rg_tasks", "basic_arithmetic", "--rg_episodes", "1", "--rg_max_new_tokens", "4"]
    summary = E.main(flags + ["--output_dir", str(tmp_path / "real")])
    assert [r["checkpoint"] for r in summary["rows"]] == ["step-2", "step-3"]
    for name in ("step-2", "step-3"):
        saved = json.loads((tmp_path / "real" / name / "results.json").read_text())
        assert saved["config"]["model"] == str(reference_run / "exports" / name)

    item = T1.rg_items([t for t in T1.cell_tasks("math") if t[1] == "basic_arithmetic"], 1, 0)[0][3]
    loaded = []

    class Engine:
        def sync_weights(self, model):
            loaded.append(type(model).__name__)

    sampler = ScriptedSampler(lambda m, k: f"<answer>{item['answer']}</answer>" if len(loaded) == 2 else "no")
    sampler.engine = Engine()
    cfg = E.EvalConfig(checkpoints=str(reference_run), suites="reasoning_gym", rg_tasks="basic_arithmetic",
                       rg_episodes=1, output_dir=str(tmp_path / "scripted"))
    summary = E.sweep_checkpoints(cfg, sampler=sampler)
    assert loaded == ["Qwen3ForCausalLM"] * 2 and summary["best"] == "step-3"  # each export's weights loaded
    rows = list(csv.DictReader(open(tmp_path / "scripted" / "checkpoints.csv")))
    assert [(r["step"], r["RG-Math"], r["Avg"], r["cells"]) for r in rows] == [("2", "0.0", "0.0", "1"), ("3", "1.0", "1.0", "1")]
    md = (tmp_path / "scripted" / "checkpoints.md").read_text()
    assert "| step-3 | - | - | - | - | 100.0 | - | - | - | 100.0 |" in md and "Best: step-3" in md


def test_local_bf16_model_trains_checkpointed_with_bf16_reference_and_export(
        tmp_path, monkeypatch, designer_model):
    """A non-tiny model directory (a tiny Qwen3 saved in bf16, as the paper's checkpoints ship):
    fp32 master weights, activation checkpointing during the update, a bf16 KL reference model,
    and a bf16 final_model; no prefix KV cache for non-tiny models."""
    from safetensors.torch import load_file

    src = tmp_path / "qwen3-bf16"
    model, tok = models.build_tiny("tiny", seed=0)
    model.to(torch.bfloat16).save_pretrained(src)
    tok.save_pretrained(src)
    seen, counts = [], {"checkpoint": 0}
    count_checkpoints(monkeypatch, counts)
    logprobs = logprobs_lib.token_logprobs
    monkeypatch.setattr(logprobs_lib, "token_logprobs", lambda m, *a, **k: (
        seen.append((next(m.parameters()).dtype, m.training)), logprobs(m, *a, **k))[1])
    engines, make_engine = [], run.make_engine
    monkeypatch.setattr(run, "make_engine",
                        lambda *a, **k: engines.append(make_engine(*a, **k)) or engines[-1])
    out = main_with(coin_script(*designer_model), BASE + ["--model", str(src), "--steps", "1", "--kl_coef", "0.01",
                             "--output_dir", str(tmp_path / "run")])
    assert counts["checkpoint"] > 0 and not engines[0].prefix_cache
    assert (torch.float32, True) in seen and (torch.bfloat16, False) in seen  # policy, reference
    final = load_file(str(out / "final_model" / "model.safetensors"))
    assert {t.dtype for t in final.values()} == {torch.bfloat16}
    assert json.loads((out / "final_model" / "config.json").read_text())["dtype"] == "bfloat16"
    assert metrics(out)[0]["losses/kl"] >= 0


def _tp_train_worker(rank, port, out_dir):
    """One rank of `--tensor_parallel_size 2` on 2 CPU processes (gloo), vLLM faked."""
    import os
    import pickle
    import sys
    from unittest import mock
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), ACCELERATE_USE_CPU="true")
    torch.set_num_threads(1)
    fake = FakeTPLLM(models.build_tiny_tokenizer())
    def make_engine(cfg, *args, **kwargs):  # the fake imported as vllm while the engine is built
        with mock.patch.dict(sys.modules, {"vllm": fake, "vllm.platforms": fake.platforms}):
            return vllm_engine.VLLMEngine("tiny", tensor_parallel_size=cfg.model.tensor_parallel_size)
    run.make_engine = make_engine
    forwarded, trained, logprobs, samples = [], [], logprobs_lib.token_logprobs, train.agent_samples
    logprobs_lib.token_logprobs = lambda m, ids, attn, *a, **k: (
        forwarded.append(int(attn.sum())), logprobs(m, ids, attn, *a, **k))[1]

    def agent_samples(episodes, **kw):   # one sample per episode in the games setting
        out = samples(episodes, **kw)
        trained.extend((ep.env_id, ep.seed, len(ep.token_ids), s.advantage) for ep, s in
                       zip([e for e in episodes if not e.hinted and e.status != "env_error"], out))
        return out
    train.agent_samples = agent_samples
    train.main(BASE + ["--tensor_parallel_size", "2", "--engine", "vllm", "--num_envs", "4",
                       "--plays", "2", "--steps", "1", "--output_dir", out_dir])
    with open(f"{out_dir}-rank{rank}.pkl", "wb") as f:
        pickle.dump({"calls": fake.calls, "forwarded": forwarded, "trained": trained}, f)


def test_tensor_parallel_group_generates_once_and_trains_each_sample_once(tmp_path):
    """--tensor_parallel_size 2 on 2 ranks: one vLLM engine across the group. Each rank designs
    and plays its own half of the pool; every engine step adds the same requests on both ranks
    (vLLM's SPMD mode needs one program), each distinct request once, and every agent sample is
    forwarded on exactly one rank. Diversity is the Vendi score of the whole pool's sources."""
    import pickle
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = str(tmp_path / "tp")
    mp.start_processes(_tp_train_worker, args=(port, out), nprocs=2, join=True,
                       start_method="spawn")
    r0, r1 = (pickle.loads(Path(f"{out}-rank{r}.pkl").read_bytes()) for r in (0, 1))
    assert r0["calls"] == r1["calls"] and r0["calls"]          # one engine program per group
    entered = [q for call in r0["calls"] for q in call]
    assert len(set(entered)) == len(entered), "a request was generated twice"
    # 4 environments x 2 plays, split over the ranks: each sample trained on one rank only
    assert len(r0["trained"]) == len(r1["trained"]) == 4
    assert {t[0] for t in r0["trained"]}.isdisjoint({t[0] for t in r1["trained"]})
    for r in (r0, r1):  # forwarded: exactly the non-zero-advantage agent samples (+ designer)
        agent_tokens = sum(n for _, _, n, a in r["trained"] if a != 0)
        assert agent_tokens > 0 and agent_tokens in {sum(r["forwarded"][:k])
                                                     for k in range(len(r["forwarded"]) + 1)}
    rows = metrics(out)
    sources = [p.read_text() for p in sorted(Path(out, "envs").glob("step-0000-rank-*/*.py"))]
    assert len(sources) == 4
    assert rows[0]["designer/diversity"] == pytest.approx(metrics_lib.diversity(sources))
    assert rows[0]["designer/diversity"] != pytest.approx(
        (metrics_lib.diversity(sources[:2]) + metrics_lib.diversity(sources[2:])) / 2)
