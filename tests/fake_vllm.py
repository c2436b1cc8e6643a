"""A vLLM stand-in for train.py's tensor-parallel tests (tests/test_train_e2e.py) and the memory
ledger built on it (tests/test_memory_order.py)."""
from runs import COIN


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
