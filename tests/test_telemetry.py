"""Step telemetry (telemetry.py): the FLOP count against the tiny models' own parameters, the
rates by hand, and a real tiny run whose perf/*, time/* and mismatch/* rows agree with its token
counts and phase seconds, reach TensorBoard, and show the rollout/trainer mismatch only when the
log-prob temperature differs from the sampling temperature."""
import json
import types
from pathlib import Path

import pytest

from infra import models
from infra import telemetry
import train

ROOT = Path(__file__).resolve().parents[1]
# one step of the real tiny policy on the hand-written environments; with a KL term every agent
# sample is forwarded (a random tiny model's groups have zero advantage)
RUN = ["--model", "tiny", "--steps", "1", "--num_envs", "2", "--skills_per_regen", "1",
       "--plays", "2", "--hint_plays", "1", "--hint_max_tokens", "8", "--max_attempts", "1", "--designer_max_tokens", "8",
       "--max_turns", "2", "--max_new_tokens", "8", "--sandbox_workers", "2",
       "--kl_coef", "0.01", "--corpus", str(ROOT / "tests" / "fixtures" / "short_corpus.jsonl")]


def matrix_params(model) -> int:
    """What a token multiplies by: every weight matrix but the embedding table, plus the head."""
    body = sum(p.numel() for n, p in model.named_parameters()
               if p.ndim >= 2 and "embed_tokens" not in n and "lm_head" not in n)
    return body + model.config.vocab_size * model.config.hidden_size


@pytest.mark.parametrize("kind", ["tiny", "tiny-moe"])
def test_model_flops_counts_the_models_own_matrices(kind):
    model, _ = models.build_tiny(kind, seed=0)
    figures = telemetry.model_flops(model.config)
    assert figures["params"] == matrix_params(model)
    head = model.config.vocab_size * 64
    # hidden 64, 2 layers, 4 query and 2 key/value heads of 32: attention 64 * 32 * (8 + 4)
    attention = 64 * 32 * 12
    # dense MLP 3 * 64 * 128; MoE: router 64 * 4 and 2 of 4 experts of 3 * 64 * 32
    mlp = 3 * 64 * 128 if kind == "tiny" else 64 * 4 + 2 * 3 * 64 * 32
    assert figures["active_params"] == head + 2 * (attention + mlp)
    assert (figures["layers"], figures["attention_dim"]) == (2, 128)
    assert (figures["active_params"] < figures["params"]) == (kind == "tiny-moe")


def test_moe_dense_layers_as_transformers_builds_them():
    cfg = types.SimpleNamespace(hidden_size=2, num_hidden_layers=4, num_attention_heads=1,
                                head_dim=1, vocab_size=10, intermediate_size=5, num_experts=4,
                                num_experts_per_tok=1, moe_intermediate_size=1,
                                decoder_sparse_step=2, mlp_only_layers=[3])
    f = telemetry.model_flops(cfg)
    # attention 2 * 1 * (2 + 2) = 8 per layer; layers 0 and 2 dense (3 * 2 * 5 = 30), layer 1
    # sparse (router 8, experts 4 x 6, one active), layer 3 dense (mlp_only_layers); head 20
    assert f["params"] == 20 + 4 * 8 + 3 * 30 + 8 + 4 * 6
    assert f["active_params"] == 20 + 4 * 8 + 3 * 30 + 8 + 6


def test_sequence_flops_and_rates_by_hand():
    fig = {"active_params": 100, "layers": 2, "attention_dim": 8}
    # passes * sum (2 P n + 4 L A n^2): 3 * ((200 * 3 + 64 * 9) + (200 * 1 + 64 * 1))
    assert telemetry.sequence_flops(fig, [3, 1]) == 3 * (600 + 576 + 200 + 64)
    assert telemetry.sequence_flops(fig, [3, 1], passes=4) == 4 * 1440
    seconds = {"regenerate": 1.0, "play": 3.0, "regret": 0.5, "update": 2.5, "sync": 1.0}
    out = telemetry.step_telemetry(seconds, generated_tokens=400, batch_tokens=160,
                                   update_tokens=320, update_flops=4e12, peak=1e12, sleep_s=0.5)
    assert out == pytest.approx({"perf/generated_tokens": 400, "perf/generate_tokens_per_s": 100.0,
                                 "perf/update_tokens_per_s": 160.0, "perf/mfu": 2.0,
                                 "perf/step_tokens_per_s": 20.0})
    cpu = telemetry.step_telemetry({"play": 0.0}, generated_tokens=0, batch_tokens=0,
                                   update_tokens=0, update_flops=0.0, peak=None)
    assert cpu == {"perf/generated_tokens": 0}  # no time, no rate; no peak, no MFU


def test_update_flops_count_every_forwarded_sequence_per_epoch_and_the_reference(monkeypatch):
    """perf/update_flops of train.grpo_update, by hand: a config with P = 58 matrix parameters
    (head 10 x 2, attention 2 x 1 x (2 + 2), MLP 3 x 2 x 5) and L x A = 1; the three samples
    with an advantage (lengths 2, 4, 3) are forwarded, the one without is not (no KL term):
    sum (2 P n + 4 L A n^2) = 248 + 528 + 384 = 1,160, x 2 epochs (--ppo_epochs 2), x 4 passes
    (forward, backward = 2 forwards, and the KL reference's forward) = 9,280."""
    import torch
    from accelerate import Accelerator

    from infra import config
    import grpo
    from infra import logprobs

    class Theta(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.theta = torch.nn.Parameter(torch.zeros(()))
            self.config = types.SimpleNamespace(hidden_size=2, num_hidden_layers=1,
                                                num_attention_heads=1, head_dim=1, vocab_size=10,
                                                intermediate_size=5)
    monkeypatch.setattr(logprobs, "token_logprobs",
                        lambda model, ids, *a, **k: model.theta * ids.float())  # (B, T)
    samples = [grpo.Sample([1] * n, [0] + [1] * (n - 1), [0.0] * n, role="agent", advantage=adv,
                           weight=1.0) for n, adv in ((2, 1.0), (4, -1.0), (3, 0.5), (5, 0.0))]
    model, ref = Theta(), Theta().requires_grad_(False)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
    out = train.grpo_update(train.Trainer(model, opt, sched, Accelerator(cpu=True), ref_model=ref),
                            samples, pad_id=0, temperatures={"agent": 1.0},
                            gargs=config.GRPOArgs(kl_coef=0.0, ppo_epochs=2))
    assert telemetry.model_flops(model.config)["active_params"] == 58
    assert out["perf/update_flops"] == 9280.0
    assert out["perf/update_tokens"] == 2 * (2 + 4 + 3)


def test_phase_seconds_and_peaks():
    starts = {"regenerate": 10.0, "play": 10.5, "update": 12.0, "log": 15.0}
    assert telemetry.phase_seconds(starts, 15.25) == {"regenerate": 0.5, "play": 1.5,
                                                      "update": 3.0, "log": 0.25}
    assert telemetry.peak_flops("NVIDIA H100 80GB HBM3") == 989e12
    assert telemetry.peak_flops("NVIDIA H100 PCIe") == 756e12
    assert telemetry.peak_flops("NVIDIA GH200 480GB") == 989e12
    assert telemetry.peak_flops("NVIDIA A100-SXM4-80GB") == 312e12
    assert telemetry.peak_flops(None) is None and telemetry.peak_flops("Intel Xeon") is None
    line = telemetry.describe(telemetry.model_flops(models.tiny_config("tiny", 1024, 0, 1)),
                              None, None)
    assert "MFU not logged" in line and "12 x 2 layers x 128" in line


def rows(run_dir):
    return [json.loads(l) for l in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_tiny_run_telemetry_tensorboard_and_mismatch(tmp_path, capsys):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    run = train.main(RUN + ["--output_dir", str(tmp_path / "same"), "--log_with", "tensorboard"])
    assert "update FLOPs per token: 6 x" in capsys.readouterr().out  # printed once, at start
    (r,) = rows(run)
    phases = ["regenerate", "play", "regret", "score", "update", "sync", "memory", "log"]
    assert r["time/step_s"] == pytest.approx(sum(r[f"time/{p}_s"] for p in phases))
    assert r["perf/generated_tokens"] > 0 and "perf/mfu" not in r  # no peak on CPU
    assert r["perf/generate_tokens_per_s"] == pytest.approx(
        r["perf/generated_tokens"] / (r["time/regenerate_s"] + r["time/play_s"]))
    assert r["perf/update_tokens_per_s"] == pytest.approx(r["perf/update_tokens"] / r["time/update_s"])
    assert r["perf/step_tokens_per_s"] == pytest.approx(r["perf/batch_tokens"] / r["time/step_s"])
    # the batch is the unhinted episodes (no designer samples at step 0), each forwarded once
    assert r["perf/batch_tokens"] == pytest.approx(r["agent/tokens_mean"] * r["agent/episodes"])
    assert r["perf/update_tokens"] == r["perf/batch_tokens"]
    # the transformers engine at the sampling temperature: the trainer's log-probs, up to fp noise
    assert r["mismatch/logp_abs_diff"] < 1e-4 and r["mismatch/k3"] < 1e-8
    assert r["losses/is_weight_capped_frac"] == 0.0
    acc = EventAccumulator(str(next((run / "spade").rglob("events.out.tfevents.*")))).Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"perf/generate_tokens_per_s", "perf/update_tokens_per_s", "perf/step_tokens_per_s",
            "time/sync_s", "mismatch/logp_abs_diff", "mismatch/k3"} <= tags
    logged = acc.Scalars("perf/update_tokens_per_s")[0]
    assert logged.step == 0 and logged.value == pytest.approx(r["perf/update_tokens_per_s"])
    # log-probs at twice the sampling temperature: the trainer is not the sampler any more
    (hot,) = rows(train.main(RUN + ["--output_dir", str(tmp_path / "hot"),
                                    "--logprob_temperature", "2.0"]))
    assert hot["mismatch/logp_abs_diff"] > 0.05 and hot["mismatch/k3"] > 1e-3
