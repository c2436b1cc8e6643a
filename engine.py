"""Rollout engines and models: where SPADE's tokens come from.

SPADE (arXiv 2608.19197) trains one policy that both writes environments (designer) and plays
them (agent); every token either role emits is sampled here. This file holds the INFRA the
paper takes for granted:

1. Model loading: short aliases for the paper's models (Qwen3-4B, Qwen3-8B, Qwen3-30B-A3B), local
   paths, and `tiny` / `tiny-moe`: small random-initialised Qwen3 / Qwen3-MoE models with a
   byte-level BPE tokenizer trained offline, so tests, benchmarks and the CPU demo need no network.

Symbols: B batch, T tokens, V vocabulary, E experts, H hidden, I expert intermediate size.

Dependencies: torch, transformers, tokenizers; vLLM is imported lazily and only on GPU.
Test: `pytest tests/test_models.py`.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent

# The paper's models (SPEC §0). Resolved only when actually loaded; nothing here touches the hub.
MODEL_ALIASES = {
    "Qwen3-4B": "Qwen/Qwen3-4B-Instruct-2507",
    "Qwen3-8B": "Qwen/Qwen3-8B",
    "Qwen3-30B-A3B": "Qwen/Qwen3-30B-A3B-Instruct-2507",
}
TINY_MODELS = ("tiny", "tiny-moe")
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>",
                  "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]


def resolve_model_name(name: str) -> str:
    """Map a short alias to its hub id; pass tiny names, hub ids and local paths through."""
    if name in TINY_MODELS or name in MODEL_ALIASES.values() or os.path.isdir(name):
        return name
    if name in MODEL_ALIASES:
        return MODEL_ALIASES[name]
    if "/" in name:
        return name  # a hub id; loading will say if it is not cached and the network is off
    known = ", ".join([*TINY_MODELS, *MODEL_ALIASES])
    raise ValueError(f"unknown model {name!r}: use one of {known}, a hub id, or a local directory")


# ----------------------------------------------------------------------------------------------
# INFRA: tiny offline tokenizer and models


def _tokenizer_training_text() -> list[str]:
    """Text the tiny BPE is trained on: the shipped corpus, environments and chat template."""
    texts = []
    corpus = HERE / "data" / "corpus.jsonl"
    if corpus.exists():
        for line in corpus.read_text(encoding="utf-8").splitlines():
            try:
                texts.append(json.loads(line).get("text", ""))
            except (json.JSONDecodeError, AttributeError):
                continue
    for path in sorted((HERE / "data" / "envs").glob("*.py")):
        texts.append(path.read_text(encoding="utf-8"))
    texts.append((HERE / "data" / "chat_template.jinja").read_text(encoding="utf-8"))
    texts.append("You are playing a language game. Make valid actions to win. \\boxed{42} "
                 "Observation: reset step reward terminated truncated info def class Env self")
    return texts


def build_tiny_tokenizer(vocab_size: int = 1024):
    """A byte-level BPE tokenizer with ChatML special tokens and a Qwen3-style chat template.

    Byte-level means every string round-trips, so the tiny model can emit anything a real one can.
    Training is deterministic for a fixed training text.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(_tokenizer_training_text(), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>", padding_side="left")
    fast.chat_template = (HERE / "data" / "chat_template.jinja").read_text(encoding="utf-8")
    return fast


def tiny_config(kind: str, vocab_size: int, eos_id: int, pad_id: int):
    """Configs of the tiny models: real Qwen3 / Qwen3-MoE architectures, a few 100k parameters."""
    from transformers import Qwen3Config, Qwen3MoeConfig

    common = dict(vocab_size=vocab_size, hidden_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32768,
                  tie_word_embeddings=True, eos_token_id=eos_id, pad_token_id=pad_id,
                  bos_token_id=None)
    if kind == "tiny":
        return Qwen3Config(intermediate_size=128, head_dim=16, **common)
    if kind == "tiny-moe":
        return Qwen3MoeConfig(intermediate_size=128, moe_intermediate_size=32, num_experts=4,
                              num_experts_per_tok=2, norm_topk_prob=True, head_dim=16, **common)
    raise ValueError(f"unknown tiny model {kind!r}: use one of {TINY_MODELS}")


def build_tiny(kind: str = "tiny", seed: int = 0, dtype: torch.dtype = torch.float32):
    """Build a random-initialised tiny model and its tokenizer, fully offline.

    Returns (model, tokenizer). The same seed gives the same weights.
    """
    from transformers import AutoModelForCausalLM, GenerationConfig

    tokenizer = build_tiny_tokenizer()
    eos_id, pad_id = tokenizer.eos_token_id, tokenizer.pad_token_id
    config = tiny_config(kind, len(tokenizer), eos_id, pad_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.generation_config = GenerationConfig(eos_token_id=eos_id, pad_token_id=pad_id,
                                               do_sample=True, temperature=0.6, top_p=0.95,
                                               top_k=20)
    return model, tokenizer


def load_model_and_tokenizer(name: str, dtype: torch.dtype = torch.bfloat16, seed: int = 0):
    """Load `name` (alias, hub id, local dir, or tiny) as (model, tokenizer).

    Tiny models are built in fp32 (CPU kernels); real models in `dtype`.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    resolved = resolve_model_name(name)
    if resolved in TINY_MODELS:
        return build_tiny(resolved, seed=seed)
    tokenizer = AutoTokenizer.from_pretrained(resolved)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(resolved, dtype=dtype)
    return model, tokenizer
