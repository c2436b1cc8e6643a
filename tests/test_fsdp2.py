"""train.py under `accelerate launch --config_file configs/fsdp2_8gpu.yaml` on 2 CPU ranks (gloo),
through Accelerate's own FSDP2 prepare (tests/fsdp2_rank.py changes only its choice of distributed
type on CPU): the KL reference, `meta` models on the ranks Accelerate fills, fp32 log-probs
through the sharded policy and reference, the process-group timeout, a checkpoint that resumes
exactly, and the held-out evaluation (--eval_every) with its items split over the ranks."""
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from runs import parity_world

ROOT = Path(__file__).resolve().parents[1]
ARGS = ["--steps", "2", "--regen_interval", "2", "--num_envs", "2", "--skills_per_regen", "1",
        "--plays", "4", "--hint_plays", "2", "--max_attempts", "1", "--designer_max_tokens", "8",
        "--hint_max_tokens", "4", "--max_turns", "1", "--max_new_tokens", "6",
        "--sandbox_workers", "1", "--checkpoint_every", "1", "--transcripts", "0",
        "--kl_coef", "0.05", "--lr", "1e-3", "--weight_decay", "10",
        "--process_group_timeout", "5400",
        "--corpus", str(ROOT / "tests" / "fixtures" / "short_corpus.jsonl")]
# the held-out suite at steps 0 and 2 (after the last): 3 items, 2 on rank 0 and 1 on rank 1, so
# a rank with less to sample keeps taking part in the other's decoding (lockstep, or a TP group)
EVAL = ["--eval_every", "2", "--eval_suites", "aime2025", "--eval_args",
        f"--data_dir {ROOT / 'tests' / 'fixtures' / 'eval'} --aime_samples 2 --max_new_tokens 4 "
        "--limit 3"]


# The environments of the run (the tiny model's designs all fail, so the step-0 pool is the
# fallback one): a reply's length decides its reward, so a random model's plays may differ within
# a group. They need not (on 2 busy cores every step-0 play here goes unpaid, and the policy
# would stay at the reference: KL exactly 0 at step 1), so the weight decay of lr 1e-3 x 10
# shrinks every weight 1% at step 0 whatever the rewards, which moves its bf16 copy. PARITY is
# tests/runs.py's.


def launch(tmp_path, out: Path, tag: str, *extra, full: bool = False, launcher=()):
    """`accelerate launch` of tests/fsdp2_rank.py on 2 processes (`launcher`: more of its flags);
    returns each rank's findings (full: and the launch's stdout + stderr)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, ACCELERATE_USE_CPU="true", FSDP2_TEST_OUT=str(tmp_path / tag))
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
           str(ROOT / "configs" / "fsdp2_8gpu.yaml"), "--num_processes", "2",
           "--main_process_port", str(port), *launcher, str(ROOT / "tests" / "fsdp2_rank.py"),
           "--model", str(tmp_path / "model"), *ARGS, "--fallback_envs", str(tmp_path / "envs"),
           "--output_dir", str(out), *EVAL, *extra]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    seen = [torch.load(tmp_path / f"{tag}-rank{r}.pt", weights_only=False) for r in (0, 1)]
    return (seen, done.stdout + done.stderr) if full else seen


def rows(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items()
             if not (k.startswith("time/") or k.endswith("_per_s") or k == "perf/mfu")}
            for line in lines]


def plain(name: str) -> str:
    """A parameter's name without the activation-checkpoint wrapper Accelerate puts around layers."""
    return name.replace("._checkpoint_wrapped_module", "")


def assert_fp32_logprobs(seen, model_dir: Path, vocab: int) -> None:
    """token_logprobs through the prepared policy and reference (tests/fsdp2_rank.py's probe
    batch) is fp32 on every rank, not bf16-rounded, and equals the unsharded model's in bf16
    compute far within what that compute itself leaves (its distance to fp32 compute)."""
    from transformers import AutoModelForCausalLM

    from fsdp2_rank import probe_batch
    from infra import logprobs
    ids, mask, completion = probe_batch(vocab)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).eval()
    with torch.no_grad():
        bf16 = logprobs.token_logprobs(model, ids, mask, completion)                # (B, T)
        fp32 = logprobs.token_logprobs(model.float(), ids, mask, completion)
    on = torch.zeros_like(completion, dtype=torch.bool)
    on[:, 1:] = completion[:, 1:] > 0
    compute = float((bf16 - fp32)[on].abs().max())
    assert bf16.dtype == torch.float32 and compute > 1e-4
    for r, s in enumerate(seen):
        for key in ("policy_logp", "ref_logp"):
            x = s[key]
            assert x.dtype == torch.float32, (r, key, x.dtype)
            on_bf16_grid = (x == x.to(torch.bfloat16).float())[on].float().mean()
            assert on_bf16_grid < 0.5, (r, key)  # bf16-rounded: every value (share 1.0)
            assert float((x - bf16)[on].abs().max()) <= 0.01 * compute, (r, key)


def assert_evaluated(out: Path, a: list[dict]) -> None:
    """eval/* at step 0 and in a row of its own after the last step, every item sampled (both
    ranks' shares gathered, each sample once) and scored."""
    assert [r["charts/step"] for r in a if "eval/aime2025/avg@2" in r] == [0, 2]
    assert set(a[2]) == {"charts/step", "eval/aime2025/avg@2", "eval/aime2025/items"} | (
        {"time/eval_s"} & set(a[0]))
    assert a[0]["eval/aime2025/items"] == a[2]["eval/aime2025/items"] == 3
    for step in (0, 2):
        got = [json.loads(x) for x in (out / "eval" / f"step-{step}" / "samples" /
                                       "aime2025.jsonl").read_text().splitlines()]
        assert [(g["id"], g["sample"]) for g in got] == [(f"fx-{i}", k) for i in (1, 2, 3)
                                                         for k in (0, 1)]


@pytest.mark.slow
def test_fsdp2_two_ranks_kl_reference_meta_loading_and_exact_resume(tmp_path):
    """A tiny Qwen3 saved in bf16, 2 steps with the KL term, a checkpoint every step, then a
    resume from the first checkpoint."""
    tok = parity_world(tmp_path, torch.bfloat16)  # bf16, as Qwen3 ships
    out = tmp_path / "run"
    first = launch(tmp_path, out, "first")
    for r, seen in enumerate(first):
        assert seen["distributed_type"] == "DistributedType.FSDP" and seen["world"] == 2
        # rank 0 reads the checkpoint for the policy and the reference; rank 1 reads nothing and
        # builds both on `meta`
        assert seen["from_pretrained"] == (2 if r == 0 else 0)
        assert seen["loaded_on_meta"] == [r == 1, r == 1]
        assert seen["init_timeout"].total_seconds() == 5400
        assert seen["policy_sharded"] and seen["ref_sharded"]
        assert seen["ref_gathered_at_end"] == []  # no full copy of its head kept between steps
    policy = {plain(n): t for n, t in first[0]["policy"].items()}
    assert all(torch.equal(first[1]["policy"][n], t) for n, t in first[0]["policy"].items())
    assert {t.dtype for t in policy.values()} == {torch.float32}  # fp32 masters
    for seen in first:  # every rank's reference: rank 0's starting policy, in the shipped bf16
        assert set(seen["ref"]) == set(policy)
        for n, t in seen["ref"].items():
            assert t.dtype == torch.bfloat16 and torch.equal(t, policy[n].to(torch.bfloat16)), n
    assert_fp32_logprobs(first, tmp_path / "model", len(tok))
    a = rows(out)
    assert [r["charts/step"] for r in a] == [0, 1, 2] and a[0]["losses/kl"] < 1e-6
    assert a[1]["losses/kl"] > a[0]["losses/kl"]  # the policy moved away from the reference
    assert_evaluated(out, a)
    # the transformers engine samples from the trainer's own bf16 weights with an fp32 head
    # (engine.fp32_head): the two log-probs differ by the body's bf16 compute alone (4.4e-4 and
    # 1.7e-4, k3 1.6e-7 and 7.6e-8; with the head's logits in bf16: 1.3e-3 and 7.2e-4, k3 1.3e-6
    # and 4.9e-7; bf16-rounded log-probs: 7.7e-3 and 8.1e-3, k3 ~4e-5)
    for r in a[:2]:
        assert r["mismatch/logp_abs_diff"] < 8e-4 and r["mismatch/k3"] < 4e-7, r
    # resume from checkpoint-1: step 1 again, identically (metrics and final weights)
    shutil.copytree(out / "final_model", tmp_path / "final_first")
    (out / "latest").write_text("checkpoint-1")
    shutil.rmtree(out / "checkpoint-2")
    again = launch(tmp_path, out, "again", "--resume")
    assert rows(out) == a  # the evaluations after the resume point too
    for seen in again:  # rebuilt from the model directory, not read from the checkpoint
        assert all(torch.equal(t, policy[n].to(torch.bfloat16)) for n, t in seen["ref"].items())
    from safetensors.torch import load_file
    before = load_file(tmp_path / "final_first" / "model.safetensors")
    after = load_file(out / "final_model" / "model.safetensors")
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in after)


@pytest.mark.slow
@pytest.mark.needs_vllm
def test_fsdp2_two_ranks_with_vllm_at_tensor_parallel_2(tmp_path):
    """The card's command shape on CPU: Accelerate's FSDP2 prepare (as above) with vLLM colocated
    at --tensor_parallel_size 2 on the same 2 ranks (vLLM's external launcher reuses Accelerate's
    process group): the KL reference starts at the policy, the sharded policy's full tensors sync
    into the TP-2 engine after each update (no vLLM weight left unloaded), and the rollout
    engine's log-probs of the second step's tokens match the trainer's (mismatch/*), which a
    missing or partial sync of the step-0 update would break. Sampling is untruncated here
    (top-k and top-p off), so that both sides compute the same log-probs (vLLM's are renormalised
    over the top-k / top-p set, README deviation 15) but for the trainer's bf16 compute."""
    parity_world(tmp_path)  # fp32: vLLM CPU and the trainer compare exactly
    left = sorted(p.name for p in Path("/dev/shm").glob("-tp:*cpushm*"))
    assert not left, f"vLLM CPU TP shared memory in use or left behind in /dev/shm: {left}"
    out = tmp_path / "run"
    seen, log = launch(tmp_path, out, "tp2", "--engine", "vllm", "--tensor_parallel_size", "2",
                       "--checkpoint_every", "2", "--top_k", "0", "--top_p", "1.0", full=True)
    assert all(s["distributed_type"] == "DistributedType.FSDP" for s in seen)
    assert "Following weights were not loaded" not in log
    a = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["charts/step"] for r in a] == [0, 1, 2] and a[0]["losses/kl"] < 1e-6
    assert_evaluated(out, a)
    # the step-0 update moved the policy away from the reference (the starting weights) ...
    assert a[1]["losses/kl"] > 1e-2
    # ... and the engine sampled step 1 from the moved policy: rollout and trainer agree far
    # better than the starting weights and the trainer do (a stale engine: mismatch ~ losses/kl)
    assert a[1]["mismatch/k3"] < 0.1 * a[1]["losses/kl"], a[1]


@pytest.mark.slow
def test_fsdp2_two_ranks_with_lora(tmp_path):
    """--lora_rank through Accelerate's FSDP2 prepare on 2 CPU ranks: the base sharded in its
    shipped bf16 beside fp32 adapters, read once (rank 0; no reference model is loaded: the
    reference is the policy with its adapters off, lora.Reference, whose log-probs through the
    sharded policy equal the policy's while B = 0), the adapters moving the policy away from it,
    the held-out evaluation of the adapted policy, and a checkpoint that resumes exactly (its
    evaluations too)."""
    parity_world(tmp_path, torch.bfloat16)
    out = tmp_path / "run"
    # LoRA's B starts at 0, so only a paid play moves the policy (weight decay cannot): --seed 1
    # is a seed whose step-0 plays are paid on some rank and differ within their group
    flags = ("--lora_rank", "4", "--lr", "2e-2", "--weight_decay", "0.1", "--plays", "8",
             "--seed", "1")
    first = launch(tmp_path, out, "lora", *flags)
    for r, seen in enumerate(first):
        assert seen["distributed_type"] == "DistributedType.FSDP" and seen["policy_sharded"]
        assert seen["from_pretrained"] == (1 if r == 0 else 0)  # the policy's base alone
        assert seen["loaded_on_meta"] == [r == 1]
        dtypes = {n: t.dtype for n, t in seen["policy"].items()}
        assert {d for n, d in dtypes.items() if "lora_" in n} == {torch.float32}
        assert {d for n, d in dtypes.items() if "lora_" not in n} == {torch.bfloat16}
        assert seen["ref"] == {}  # no weights of its own
        assert torch.equal(seen["policy_logp"], seen["ref_logp"])  # B = 0: the same model
    a = rows(out)
    assert [r["charts/step"] for r in a] == [0, 1, 2] and a[0]["losses/kl"] < 1e-9
    assert a[1]["losses/kl"] > 1e-7, a  # the adapters moved the policy from the reference
    assert_evaluated(out, a)  # the held-out suite samples the adapted policy on both ranks
    # the engine samples from the trainer's adapters with an fp32 head (engine.fp32_head): the
    # body's bf16 compute alone differs (4.4e-4 and 7.4e-4, k3 1.7e-7 and 4.5e-7)
    for r in a[:2]:
        assert r["mismatch/logp_abs_diff"] < 1.5e-3 and r["mismatch/k3"] < 1e-6, r
    shutil.copytree(out / "final_model", tmp_path / "final_first")
    (out / "latest").write_text("checkpoint-1")
    shutil.rmtree(out / "checkpoint-2")
    launch(tmp_path, out, "lora-again", *flags, "--resume")
    assert rows(out) == a
    from safetensors.torch import load_file
    before = load_file(tmp_path / "final_first" / "adapter_model.safetensors")
    after = load_file(out / "final_model" / "adapter_model.safetensors")
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in after)
    # PEFT's names, without the layers' activation-checkpoint wrapper: peft and vLLM load them
    assert all(k.startswith("base_model.model.model.layers.") and "_checkpoint" not in k
               for k in after)
