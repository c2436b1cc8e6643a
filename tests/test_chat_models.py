"""Any chat model: the end of turn comes from the template, tools reach the agent even through a
template that drops them, on tiny random models of two families (Qwen3 and Llama) whose EOS is not
their end-of-turn token (as in Qwen3 Base: EOS `<|endoftext|>`, turns end with `<|im_end|>`)."""
import json
import logging

import pytest
import torch

import agent
from infra import engine
from infra import models
from agent import EpisodeSpec, play, render_chat, turn_end
from infra.stream import Batched, Completion

# Templates written for these tests, in the two families' formats; "+tools" ones render tools=.
CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + "
          "'<|im_end|>\\n' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
LLAMA_TURNS = ("{% for m in messages %}{{ '<|start_header_id|>' + m['role'] + "
               "'<|end_header_id|>\\n\\n' + m['content'] + '<|eot_id|>' }}{% endfor %}"
               "{% if add_generation_prompt %}"
               "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}")
LLAMA = "{{ '<|begin_of_text|>' }}" + LLAMA_TURNS
LLAMA_TOOLS = ("{{ '<|begin_of_text|>' }}{% if tools %}"
               "{{ '<|start_header_id|>system<|end_header_id|>\\n\\nFunctions you may call:' }}"
               "{% for t in tools %}{{ '\\n' + (t | tojson) }}{% endfor %}{{ '<|eot_id|>' }}"
               "{% endif %}" + LLAMA_TURNS)
NO_SYSTEM = ("{% for m in messages %}{% if m['role'] == 'system' %}"
             "{{ raise_exception('System role not supported') }}{% endif %}"
             "{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
             "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
LLAMA_SPECIAL = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
                 "<|end_of_text|>"]
EOT = {"qwen3": "<|im_end|>", "llama": "<|eot_id|>"}
TOOL = {"type": "function", "function": {"name": "lookup", "description": "Look a key up.",
        "parameters": {"type": "object", "properties": {"key": {"type": "string"}}}}}


@pytest.fixture(scope="module")
def families():
    """family -> (model, tokenizer): a tiny random Qwen3 with Qwen3 Base's EOS, and a tiny random
    Llama with Llama 3's special tokens and EOS `<|end_of_text|>`."""
    from transformers import AutoModelForCausalLM, LlamaConfig
    out = {}
    for family in ("qwen3", "llama"):
        tok = models.build_tiny_tokenizer()
        if family == "qwen3":
            tok.eos_token = "<|endoftext|>"
            config = models.tiny_config("tiny", len(tok), tok.eos_token_id, tok.pad_token_id)
        else:
            tok.add_special_tokens({"additional_special_tokens": LLAMA_SPECIAL})
            tok.eos_token = "<|end_of_text|>"
            config = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                                 num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                 head_dim=16, tie_word_embeddings=True, bos_token_id=None,
                                 eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        torch.manual_seed(0)
        out[family] = AutoModelForCausalLM.from_config(config), tok
    return out


def with_template(tok, template):
    import copy
    tok = copy.deepcopy(tok)
    tok.chat_template = template
    return tok


class CountEnv:
    """Three turns of feedback, then a win; tools() for the tool setting."""

    def reset(self, seed=None):
        self.turn = 0
        return "Say a number.", {}

    def tools(self):
        return [TOOL]

    def step(self, action):
        self.turn += 1
        outs = [f"value of {c['arguments'].get('key')}" for c in agent.parse_tool_calls(action)]
        return f"turn {self.turn}", 1.0, self.turn >= 3, False, {"tool_outputs": outs}


# ----------------------------------------------------------------------------------------------
# end of turn


@pytest.mark.parametrize("family,template", [("qwen3", CHATML), ("qwen3", "qwen3_fixture"),
                                             ("llama", LLAMA), ("llama", LLAMA_TOOLS)])
def test_turn_end_is_read_from_the_template(request, families, family, template):
    if template == "qwen3_fixture":
        template = request.getfixturevalue("qwen3_template")
    tok = with_template(families[family][1], template)
    text, token = turn_end(tok)
    assert text == EOT[family] and token == tok.convert_tokens_to_ids(EOT[family])
    assert token != tok.eos_token_id
    plain = with_template(tok, "{% for m in messages %}{{ m['role'] + ': ' + m['content'] + '\\n' }}"
                               "{% endfor %}")
    assert turn_end(plain) == (tok.eos_token, tok.eos_token_id)  # no marker: the EOS it is


@pytest.mark.parametrize("family,template", [("qwen3", CHATML), ("llama", LLAMA)])
def test_replies_stop_at_end_of_turn_and_observations_stay_exact(families, family, template):
    model, tok = families[family]
    tok = with_template(tok, template)
    eot = tok.convert_tokens_to_ids(EOT[family])
    bias = torch.zeros(model.config.vocab_size)
    bias[eot] = 6.0  # the random model ends its turns within a few tokens
    hook = model.lm_head.register_forward_hook(lambda mod, inp, out: out + bias)
    try:
        # without the template's end of turn the engine runs every reply to its cap
        [cut] = engine.TransformersEngine(model, tok).generate(
            [tok.encode("Hi", add_special_tokens=False)], max_new_tokens=12, seed=0)
        assert cut.finish_reason == "length" and eot in cut.token_ids
        eng = engine.TransformersEngine(model, tok, stop_ids=[turn_end(tok)[1]])
        outs = []

        def generate(prompts, caps):
            outs.append(eng.generate(prompts, max_new_tokens=caps, seed=len(outs)))
            return outs[-1]
        eps = play([EpisodeSpec("count", s, None, CountEnv()) for s in range(2)],
                   stream=Batched(generate), tokenizer=tok, max_new_tokens=40)
    finally:
        hook.remove()
    assert all(o.finish_reason == "stop" and o.token_ids[-1] == eot for out in outs for o in out)
    for ep in eps:
        assert (ep.status, ep.turns) == ("terminated", 3)
        replies = [t for t, m in zip(ep.token_ids, ep.mask) if m]
        assert replies.count(eot) == 3 and tok.eos_token_id not in ep.token_ids
        # the trained sequence reads exactly as the template renders the conversation
        rendered = render_chat(tok, ep.messages, generation_prompt=False)
        assert rendered.startswith(tok.decode(ep.token_ids)) and rendered.endswith(EOT[family] + (
            "\n" if family == "qwen3" else ""))
        observation = [t for t, m in zip(ep.token_ids[ep.prompt_len:], ep.mask[ep.prompt_len:])
                       if not m]
        assert tok.decode(observation).count(EOT[family]) == 2  # the two user turns' own ends


def test_a_reply_ending_on_a_base_models_eos_gets_the_template_end_of_turn(families):
    """Qwen3 Base may end a reply with `<|endoftext|>`: the turn is then closed by the template's
    `<|im_end|>` as observation tokens (this raised mid-batch when only EOS could end a turn)."""
    _, tok = families["qwen3"]
    tok = with_template(tok, CHATML)

    def generate(prompts, caps):
        ids = tok.encode("\\boxed{1}", add_special_tokens=False) + [tok.eos_token_id]
        return [Completion(ids, [-0.5] * len(ids), "", "stop") for _ in prompts]
    [ep] = play([EpisodeSpec("count", 0, None, CountEnv())], stream=Batched(generate), tokenizer=tok)
    assert ep.status == "terminated" and ep.actions == ["\\boxed{1}"] * 3
    text = tok.decode(ep.token_ids)
    assert "\\boxed{1}<|endoftext|><|im_end|>\n<|im_start|>user\nturn 1<|im_end|>" in text
    k = ep.token_ids.index(tok.eos_token_id)
    assert ep.mask[k] == 1 and ep.mask[k + 1] == 0  # EOS was sampled, <|im_end|> was not


# ----------------------------------------------------------------------------------------------
# tools the template drops


def play_tools(tok):
    eot = turn_end(tok)[1]
    replies = ['<tool_call>\n{"name": "lookup", "arguments": {"key": "a"}}\n</tool_call>',
               "<answer>a</answer>", "<answer>b</answer>"]
    prompts = []

    def generate(ps, caps):
        prompts.append(ps[0])
        ids = tok.encode(replies[len(prompts) - 1], add_special_tokens=False) + [eot]
        return [Completion(ids, [-0.5] * len(ids), "", "stop")]
    [ep] = play([EpisodeSpec("count", 0, None, CountEnv())], stream=Batched(generate), tokenizer=tok,
                setting="tool")
    return ep, tok.decode(ep.token_ids)


@pytest.mark.parametrize("family,template,native", [("qwen3", "qwen3_fixture", True),
                                                    ("qwen3", CHATML, False),
                                                    ("llama", LLAMA_TOOLS, True),
                                                    ("llama", LLAMA, False)])
def test_tools_reach_the_agent_whatever_the_template(request, families, monkeypatch, caplog,
                                                     family, template, native):
    if template == "qwen3_fixture":
        template = request.getfixturevalue("qwen3_template")
    monkeypatch.setattr(agent, "_TOOL_PLACES", {})
    tok = with_template(families[family][1], template)
    with caplog.at_level(logging.WARNING, logger="agent"):
        ep, text = play_tools(tok)
    assert ep.status == "terminated" and ep.turns == 3
    assert ep.actions[0] == '<tool_call>{"name": "lookup", "arguments": {"key": "a"}}</tool_call>'
    assert json.dumps(TOOL["function"]["name"]) in text  # the agent was shown its tool
    # the episode records its first prompt as rendered: the tools are in it, not in messages
    assert text.startswith(ep.rendered_prompt) and ep.rendered_prompt.endswith(
        tok.decode(ep.token_ids[:ep.prompt_len]))
    assert "Look a key up." in ep.rendered_prompt  # the tool's description
    assert not any("Look a key up." in m["content"] for m in ep.messages)
    warned = [r.getMessage() for r in caplog.records if "ignores tools=" in r.getMessage()]
    if native:
        assert not warned and agent.TOOL_BLOCK[:40] not in text  # the template's own block
        return
    assert len(warned) == 1 and "system message" in warned[0]
    system = {"qwen3": "<|im_start|>system\n", "llama": "<|start_header_id|>system<|end_header_id|>\n\n"}
    block = agent.TOOL_BLOCK.format(tools=json.dumps(TOOL))
    assert system[family] + block + EOT[family] in text
    # the tool's output comes back as a Hermes <tool_response> in a user turn
    user = {"qwen3": "<|im_start|>user\n", "llama": "<|start_header_id|>user<|end_header_id|>\n\n"}
    assert user[family] + "<tool_response>\nvalue of a\n</tool_response>" + EOT[family] in text


def test_tool_block_without_a_system_role_or_a_clear_error(families, monkeypatch, caplog):
    monkeypatch.setattr(agent, "_TOOL_PLACES", {})
    tok = with_template(families["qwen3"][1], NO_SYSTEM)
    with caplog.at_level(logging.WARNING, logger="agent"):
        ep, text = play_tools(tok)
    assert "in the user message" in caplog.text
    assert text.startswith("<|im_start|>user\n" + agent.TOOL_BLOCK.format(tools=json.dumps(TOOL)))
    assert ep.status == "terminated"
    hostile = with_template(tok, NO_SYSTEM.replace("m['content']", "m['content'] | upper"))
    hostile.name_or_path = "acme/shouting-chat"
    with pytest.raises(ValueError, match="acme/shouting-chat's chat template ignores tools="):
        play_tools(hostile)


def test_eval_engine_sampler_shows_tools_a_template_drops(families, monkeypatch):
    import eval as E
    monkeypatch.setattr(agent, "_TOOL_PLACES", {})
    tok = with_template(families["llama"][1], LLAMA)

    class FakeEngine:
        def generate(self, prompts, **kwargs):
            self.prompts = prompts
            return [Completion([], [], "", "stop") for _ in prompts]
    fake = FakeEngine()
    E.EngineSampler(fake, tok).chat([[{"role": "user", "content": "hi"}]], temperature=1.0,
                                    top_p=1.0, max_new_tokens=4, tools=[[TOOL]])
    assert "<tools>\n" + json.dumps(TOOL) + "\n</tools>" in tok.decode(fake.prompts[0])
