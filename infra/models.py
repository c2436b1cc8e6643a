"""Models: the weights and tokenizer SPADE starts from (infrastructure).

SPADE (arXiv 2608.19197) trains Qwen3-4B, Qwen3-8B and Qwen3-30B-A3B. This file resolves their
short aliases (also hub ids and local paths) and loads (model, tokenizer), left-padded, with SDPA
attention (flash-attention 2 on a GPU where it is installed). `tiny` / `tiny-moe` are random
Qwen3 / Qwen3-MoE models of a few 100k parameters with a byte-level BPE tokenizer trained here,
offline, on the shipped corpus and environments, under a Qwen3-style chat template
(`data/chat_template.jinja`), so tests, benchmarks and the CPU quick-start need no network.

Dependencies: torch, transformers, tokenizers (and accelerate for an empty model, see
load_model_and_tokenizer). Test: `pytest tests/test_models.py -m ""` (-m "": its launches too).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parents[1]  # the repository: data/, configs/

# The paper's models. Resolved only when actually loaded; nothing here touches the hub.
MODEL_ALIASES = {
    "Qwen3-4B": "Qwen/Qwen3-4B-Instruct-2507",
    "Qwen3-8B": "Qwen/Qwen3-8B",
    "Qwen3-30B-A3B": "Qwen/Qwen3-30B-A3B-Instruct-2507",
}
TINY_MODELS = ("tiny", "tiny-moe")
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>",
                  "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]


def resolve_model_name(name: str) -> str:
    """Map a short alias to its hub id; pass tiny names, hub ids and local paths through (a hub id
    that is not cached fails when loaded with the network off)."""
    if os.path.isdir(name) and not os.path.isfile(os.path.join(name, "config.json")):
        raise ValueError(f"the directory {name} holds no model (no config.json)")
    if is_tiny(name) or "/" in name or os.path.isdir(name):
        return name
    if name in MODEL_ALIASES:
        return MODEL_ALIASES[name]
    known = ", ".join([*TINY_MODELS, *MODEL_ALIASES])
    raise ValueError(f"unknown model {name!r}: use one of {known}, a hub id, or a local directory")


def is_tiny(name: str) -> bool:
    """Whether `name` is one of the tiny offline models (built in memory, never on disk): the name
    itself, which resolve_model_name passes through (no alias names one), so an unknown name is
    simply not tiny here and fails where it is loaded."""
    return name in TINY_MODELS


# ----------------------------------------------------------------------------------------------
# INFRA: tiny offline tokenizer and models


def build_tiny_tokenizer(vocab_size: int = 1024):
    """A byte-level BPE tokenizer (every string round-trips) with ChatML special tokens and a
    Qwen3-style chat template, trained deterministically on the shipped corpus and environments."""
    from tokenizers import Tokenizer, decoders, pre_tokenizers, trainers
    from tokenizers.models import BPE
    from transformers import PreTrainedTokenizerFast

    data = HERE / "data"
    template = (data / "chat_template.jinja").read_text(encoding="utf-8")
    corpus = (data / "corpus.jsonl").read_text(encoding="utf-8").splitlines()
    texts = [json.loads(line)["text"] for line in corpus]
    texts += [path.read_text(encoding="utf-8") for path in sorted((data / "envs").glob("*.py"))]
    texts += [template, "This is a text game: play it with legal moves and try to win. \\boxed{42} "
              "Observation: reset step reward terminated truncated info def class Env self"]
    tok = Tokenizer(BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>", padding_side="left")
    fast.chat_template = template
    return fast


def tiny_config(kind: str, vocab_size: int, eos_id: int, pad_id: int):
    """Configs of the tiny models: real Qwen3 / Qwen3-MoE architectures, a few 100k parameters.
    head_dim 32: vLLM's CPU attention refuses 16 (tests/test_vllm.py runs these models on it)."""
    from transformers import Qwen3Config, Qwen3MoeConfig

    common = dict(vocab_size=vocab_size, hidden_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32768,
                  tie_word_embeddings=True, eos_token_id=eos_id, pad_token_id=pad_id,
                  bos_token_id=None)
    if kind == "tiny":
        return Qwen3Config(intermediate_size=128, head_dim=32, **common)
    if kind == "tiny-moe":
        return Qwen3MoeConfig(intermediate_size=128, moe_intermediate_size=32, num_experts=4,
                              num_experts_per_tok=2, norm_topk_prob=True, head_dim=32, **common)
    raise ValueError(f"unknown tiny model {kind!r}: use one of {TINY_MODELS}")


def build_tiny(kind: str = "tiny", seed: int = 0, dtype: torch.dtype = torch.float32):
    """(model, tokenizer): a random-initialised tiny model built offline; seed fixes the weights."""
    from transformers import AutoModelForCausalLM, GenerationConfig

    tokenizer = build_tiny_tokenizer()
    eos_id, pad_id = tokenizer.eos_token_id, tokenizer.pad_token_id
    config = tiny_config(kind, len(tokenizer), eos_id, pad_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    model.generation_config = GenerationConfig(eos_token_id=eos_id, pad_token_id=pad_id,
                                               do_sample=True, temperature=0.6, top_p=0.95,
                                               top_k=20)
    return model, tokenizer


def architecture(name: str):
    """The transformers config of a model, without its weights and offline for the paper's models:
    their `config.json` ships in configs/models/<alias>.json (architecture numbers are facts), so a
    full-size model can be built on the meta device or sized on a laptop. Tiny models: their
    config; a local directory: its config.json; another hub id: the cached config."""
    from transformers import AutoConfig
    resolved = resolve_model_name(name)
    if is_tiny(resolved):
        return tiny_config(resolved, 1024, 2, 0)  # sizes as build_tiny's tokenizer makes them
    alias = {hub: alias for alias, hub in MODEL_ALIASES.items()}.get(resolved, name)
    shipped = HERE / "configs" / "models" / f"{alias}.json"
    if shipped.is_file():
        fields = json.loads(shipped.read_text(encoding="utf-8"))
        return AutoConfig.for_model(fields.pop("model_type"), **fields)
    return AutoConfig.from_pretrained(resolved)


def shipped_dtype(name: str) -> torch.dtype:
    """The dtype a model's checkpoint ships in (bf16 for the paper's models; fp32 for tiny):
    run.Run keeps the KL reference model in it and exports the policy in it."""
    resolved = resolve_model_name(name)
    if is_tiny(resolved):
        return torch.float32
    dtype = getattr(architecture(name), "dtype", None) or torch.bfloat16
    return getattr(torch, dtype) if isinstance(dtype, str) else dtype


def cannot_load(name: str, error: Exception, program: str) -> str:
    """The one line a command prints when --model cannot be loaded: the model, why, what to do.
    A hub id that is neither cached nor reachable (offline, or HF_HUB_OFFLINE=1) gets the way out
    (download it where there is network, or point --model at a local directory)."""
    from huggingface_hub import constants
    first = (str(error).strip().splitlines() or [type(error).__name__])[0]
    resolved = name if isinstance(error, ValueError) else resolve_model_name(name)
    if isinstance(error, OSError) and not os.path.isdir(resolved) and (
            constants.HF_HUB_OFFLINE or "couldn't connect" in first or "offline" in first.lower()):
        return (f"{program}: --model {name} ({resolved}) is not in the Hugging Face cache "
                f"({constants.HF_HUB_CACHE}) and the hub cannot be reached: download it where "
                f"there is network (`hf download {resolved}`) and copy that cache here, or pass "
                "a local model directory as --model")
    return f"{program}: cannot load --model {name} ({resolved}): {first}"


def check_loadable(name: str, program: str) -> None:
    """Stop in one line (cannot_load) when --model cannot be loaded, before a run starts: a hub
    model's config is read from the cache or the hub (the weights are not fetched here)."""
    try:
        resolved = resolve_model_name(name)
        if not is_tiny(resolved) and not os.path.isdir(resolved):
            from transformers import AutoConfig
            AutoConfig.from_pretrained(resolved)
    except (OSError, ValueError) as e:
        raise SystemExit(cannot_load(name, e, program)) from None


def parameter_count(name: str) -> int:
    """A model's parameters from its architecture alone, built on the meta device (no weights, no
    memory: a second for Qwen3-30B-A3B); tied embeddings count once, as they ship."""
    from transformers import AutoModelForCausalLM
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(architecture(name))
    return sum(p.numel() for p in model.parameters())


def load_model_and_tokenizer(name: str, dtype: torch.dtype = torch.bfloat16, seed: int = 0, *,
                             empty: bool = False):
    """(model, tokenizer) for an alias, hub id, local dir, or tiny (fp32, for CPU kernels).

    empty=True reads no weights: the architecture with every parameter on `meta` (no memory) and
    real buffers (rotary tables, which are computed, not loaded). It is what the ranks but the
    main one hold under FSDP2 with cpu_ram_efficient_loading: Accelerate's prepare shards the
    model on `meta` and fills every shard from the main process's weights, so loading them on
    each of 8 ranks would only cost host RAM (8 fp32 copies of a 30B model, about 1 TB)."""
    import importlib.util

    from transformers import AutoModelForCausalLM, AutoTokenizer

    resolved = resolve_model_name(name)
    if is_tiny(resolved):
        with _empty_weights(empty):
            model, tokenizer = build_tiny(resolved, seed=seed)
        model.tie_weights()  # see _empty_weights
        return model, tokenizer
    tokenizer = AutoTokenizer.from_pretrained(resolved)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    flash = torch.cuda.is_available() and importlib.util.find_spec("flash_attn")
    attn = "flash_attention_2" if flash else "sdpa"
    if not empty:
        model = AutoModelForCausalLM.from_pretrained(resolved, dtype=dtype,
                                                     attn_implementation=attn)
        return model, tokenizer
    from transformers import AutoConfig, GenerationConfig
    config = AutoConfig.from_pretrained(resolved)
    with _empty_weights(True):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=attn)
    model.tie_weights()  # see _empty_weights
    try:  # the main process's model has it (the transformers engine reads its EOS ids)
        model.generation_config = GenerationConfig.from_pretrained(resolved)
    except OSError:
        pass
    return model, tokenizer


def _empty_weights(empty: bool):
    """Parameters created on `meta` inside the block (when `empty`), buffers real. The model
    built inside must be tied again (`tie_weights()`): accelerate's init_empty_weights
    re-registers every parameter after transformers tied the head to the embedding."""
    from contextlib import nullcontext

    from accelerate import init_empty_weights
    return init_empty_weights(include_buffers=False) if empty else nullcontext()
