"""The tiny offline models are real Qwen3 / Qwen3-MoE models: forward, sampling, chat template."""
import pytest
import torch

from infra import logprobs
from infra import models

TOOLS = [{"type": "function", "function": {
    "name": "lookup_order", "description": "Find an order by id.",
    "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}},
                   "required": ["order_id"]}}}]


@pytest.mark.parametrize("fixture,arch", [("tiny", "Qwen3ForCausalLM"),
                                          ("tiny_moe", "Qwen3MoeForCausalLM")])
def test_forward_and_generate_with_logprobs(request, fixture, arch):
    model, tok = request.getfixturevalue(fixture)
    assert type(model).__name__ == arch
    n_params = sum(p.numel() for p in model.parameters())
    assert 50_000 < n_params < 2_000_000
    ids = torch.tensor([tok.encode("The tides follow the moon.")])
    logits = model(ids).logits  # (1, T, V)
    assert logits.shape == (1, ids.shape[1], len(tok)) and torch.isfinite(logits).all()
    torch.manual_seed(0)
    out = model.generate(ids, max_new_tokens=6, do_sample=True, output_logits=True,
                         return_dict_in_generate=True)
    seq = out.sequences                                                # (1, T + 6)
    new = seq[0, ids.shape[1]:]
    # the sampled tokens' log-probs under cached decoding (generate's raw logits, before its top-k /
    # top-p warpers) equal the trainer's, from one uncached forward through logprobs.token_logprobs
    sampled = torch.stack([torch.log_softmax(s[0].float(), -1)[t] for s, t in zip(out.logits, new)])
    mask = torch.zeros_like(seq)
    mask[0, ids.shape[1]:] = 1
    with torch.no_grad():
        trained = logprobs.token_logprobs(model, seq, torch.ones_like(seq), mask)[0, ids.shape[1]:]
    assert len(new) == 6 and torch.allclose(sampled, trained, atol=1e-4), (sampled, trained)


def test_same_seed_same_weights():
    a, _ = models.build_tiny("tiny", seed=3)
    b, _ = models.build_tiny("tiny", seed=3)
    c, _ = models.build_tiny("tiny", seed=4)
    wa, wb, wc = (m.model.embed_tokens.weight for m in (a, b, c))
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)


def test_tokenizer_round_trips_any_text(tokenizer):
    text = "Grüße \\boxed{x_1 + 2} 🙂\n\ttab <|im_end|>"
    assert tokenizer.decode(tokenizer.encode(text)) == text
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    assert tokenizer.padding_side == "left"


def test_chat_template_round_trip_plain(tokenizer):
    msgs = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": "\\boxed{4}"}]
    text = tokenizer.apply_chat_template(msgs, tokenize=False)
    assert text == ("<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
                    "<|im_start|>assistant\n<think>\n\n</think>\n\n\\boxed{4}<|im_end|>\n")
    ids = tokenizer.apply_chat_template(msgs, tokenize=True, return_dict=False)
    assert tokenizer.decode(ids) == text
    prompt = tokenizer.apply_chat_template(msgs[:2], tokenize=False, add_generation_prompt=True)
    assert prompt.endswith("<|im_start|>assistant\n")
    no_think = tokenizer.apply_chat_template(msgs[:2], tokenize=False, add_generation_prompt=True,
                                             enable_thinking=False)
    assert no_think == prompt + "<think>\n\n</think>\n\n"


def test_chat_template_drops_earlier_reasoning(tokenizer):
    first = [{"role": "user", "content": "a"},
             {"role": "assistant", "content": "<think>\nplan\n</think>\n\n\\boxed{1}"}]
    before = tokenizer.apply_chat_template(first, tokenize=False)
    after = tokenizer.apply_chat_template(first + [{"role": "user", "content": "b"}],
                                          tokenize=False)
    assert "plan" in before and "plan" not in after
    assert not after.startswith(before)  # the Qwen3 behaviour the agent must handle


def test_chat_template_with_tools(tokenizer):
    msgs = [{"role": "user", "content": "Where is order 7?"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"type": "function",
                 "function": {"name": "lookup_order", "arguments": {"order_id": "7"}}}]},
            {"role": "tool", "content": "shipped"}]
    text = tokenizer.apply_chat_template(msgs, tools=TOOLS, tokenize=False,
                                         add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\n# Tools")
    assert '"name": "lookup_order"' in text
    assert '<tool_call>\n{"name": "lookup_order", "arguments": {"order_id": "7"}}\n</tool_call>' in text
    assert "<|im_start|>user\n<tool_response>\nshipped\n</tool_response><|im_end|>\n" in text
    assert text.endswith("<|im_start|>assistant\n")
    assert tokenizer.decode(tokenizer.encode(text)) == text


def test_aliases_resolve_without_network():
    assert models.resolve_model_name("Qwen3-30B-A3B") == "Qwen/Qwen3-30B-A3B-Instruct-2507"
    assert models.resolve_model_name("Qwen3-4B") == "Qwen/Qwen3-4B-Instruct-2507"
    assert models.resolve_model_name("tiny-moe") == "tiny-moe"
    with pytest.raises(ValueError, match="unknown model"):
        models.resolve_model_name("Qwen3-5B")


def test_empty_model_reads_no_weights(tmp_path):
    """empty=True, what the ranks that Accelerate's FSDP2 prepare fills hold: every parameter on
    `meta`, the rotary buffers real (prepare keeps them), the head still tied, and the
    checkpoint's generation config (the transformers engine's EOS ids)."""
    model, tok = models.build_tiny("tiny", seed=0)
    model.generation_config.eos_token_id = [5, 7]
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    for name in (str(tmp_path), "tiny-moe"):
        empty, _ = models.load_model_and_tokenizer(name, dtype=torch.float32, empty=True)
        assert all(p.is_meta for p in empty.parameters()), name
        assert empty.lm_head.weight is empty.model.embed_tokens.weight, name
        real = dict(models.load_model_and_tokenizer(name, dtype=torch.float32)[0].named_buffers())
        assert {n: b for n, b in empty.named_buffers()}.keys() == real.keys()
        assert all(torch.equal(b, real[n]) for n, b in empty.named_buffers()), name
        if name == str(tmp_path):
            assert empty.generation_config.eos_token_id == [5, 7]


@pytest.mark.parametrize("alias,billions,hub", [("Qwen3-4B", 4.02, "Qwen/Qwen3-4B-Instruct-2507"),
                                                ("Qwen3-8B", 8.19, "Qwen/Qwen3-8B"),
                                                ("Qwen3-30B-A3B", 30.53, None)])
def test_paper_architectures_ship_offline(alias, billions, hub, tmp_path, monkeypatch):
    """The paper models' configs ship in configs/models/: a full-size model builds on the meta
    device with no hub access (an empty HF cache), with the published parameter counts."""
    from transformers import AutoModelForCausalLM
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    config = models.architecture(hub or alias)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    assert sum(p.numel() for p in model.parameters()) / 1e9 == pytest.approx(billions, abs=0.005)
    assert models.shipped_dtype(alias) == torch.bfloat16
    assert config.tie_word_embeddings == (alias == "Qwen3-4B")


@pytest.mark.slow  # train.py and eval.py launched as a user launches them
@pytest.mark.parametrize("argv", [["train.py", "--model", "Qwen3-30B-A3B"],
                                  ["eval.py", "--model", "Qwen3-30B-A3B", "--suites", "aime2025"]])
def test_an_uncached_model_offline_is_one_line_that_says_what_to_do(tmp_path, argv):
    """A new user's first command on a machine without the weights and without network: one
    line naming the model and the way out, no traceback, and no run directory left behind (a
    rerun after the download then needs no --overwrite)."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "empty_hf_home"))
    env.pop("HF_HUB_CACHE", None)
    out = subprocess.run([sys.executable, str(root / argv[0]), *argv[1:], "--output_dir",
                          str(tmp_path / "run")], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=300)
    lines = [line for line in out.stderr.splitlines() if not line.startswith("[spade] warning")]
    assert out.returncode == 1 and len(lines) == 1, out.stderr[-3000:]
    assert lines[0].startswith(f"{argv[0]}: --model Qwen3-30B-A3B (Qwen/Qwen3-30B-A3B-Instruct-2507)")
    assert "hf download Qwen/Qwen3-30B-A3B-Instruct-2507" in lines[0] and "local model" in lines[0]
    assert not (tmp_path / "run").exists()
