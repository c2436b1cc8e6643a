"""The Reasoning Agent: batched multi-turn play of designer-written environments.

SPADE (arXiv 2608.19197; Algorithm 1 line 7, the games of Sec. 4.1 and the tools of Sec. 4.2)
trains one policy that, as the Reasoning Agent, plays the environments it designed, turn by turn,
with and without the privileged hint. `play` turns a batch of (environment, seed, hint) triples
into token-exact training records:

    sequence = prompt, reply_1 (mask 1), observation_1 (mask 0), reply_2 (mask 1), ...
    return   = the last step's reward clipped to [-1, 1] if that step terminated, else 0

(the return is what Eq. (3) averages). Each episode's next turn goes to the engine as soon as its
environment has answered (no turn barrier; the environments of the replies that come back together
step in one batched call); the sampled tokens and log-probs are appended verbatim (the trained
sequence is exactly what the model saw and produced), and observation tokens are only what the
chat template puts after the last reply (`_Renderer`). Tool calls are normalised for
ToolEnv.step() and their outputs come back as tool messages. Symbols: T tokens of one episode;
mask[t] = 1 on replies.

Deviations from the paper / the authors' code:
1. The action is the LAST balanced `\\boxed{...}` after the last `</think>` (authors: the first);
   like the authors we strip whitespace and up to two extra brace levels around the move.
2. Episodes ended by an environment fault get status "env_error" and no reward (the authors give
   -1 for a crash); train.py drops them from the agent batch.
3. A reply cut by the per-turn cap ends the episode ("truncated"; "context" when the cap was the
   remaining context) in both arms; the authors' hinted arm feeds the cut reply to the environment.
4. A chat template that ignores `tools=` gets them as a Qwen3/Hermes block in its system message,
   tool outputs as `<tool_response>` user turns (`render_chat`, logged); the authors use it as is.
5. The games prompt's first sentence (`PREAMBLE`) says the authors' instruction in our own words;
   the layout (preamble, observation, answer format) and what it asks are theirs.

Dependencies: the standard library and the tokenizer object passed in.
Test: `pytest tests/test_agent.py tests/test_chat_models.py`.
"""
from __future__ import annotations

import json
import logging
import re
import secrets
from dataclasses import dataclass, field
from typing import Any, Callable

PREAMBLE = "This is a text game: play it with legal moves and try to win."  # deviation 5
CONTEXT_MARGIN = 64  # context tokens a reply may never take (the authors' minimum to generate)
ANSWER_FORMAT = "Please reason step by step, and put your final answer within \\boxed{}."  # Fig. 5
FORMAT_HINT = ("[FORMAT] Your last <tool_call> could not be parsed. Write each call exactly as "
               '<tool_call>{"name": "<tool name>", "arguments": {<arguments as JSON>}}'
               "</tool_call>.")

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------------------------
# ALGO: action parsing

# a box opener, one brace, a run of other text, or a lone backslash: the reply cut into pieces
_BRACES = re.compile(r"\\boxed\{|[{}]|[^{}\\]+|\\")


def last_balanced_box(text: str) -> str | None:
    r"""Content of the last `\boxed{...}` whose braces balance (the closed box that opened last);
    None when there is none. One pass with a stack of open braces (where a box's content starts,
    or -1 for a plain brace): linear in the reply, where re-scanning from every box is quadratic."""
    if "\\boxed{" not in text or "}" not in text:  # the common cheap answers, in C
        return None
    stack, best, pos = [], None, 0
    for piece in _BRACES.findall(text):
        if piece == "}" and stack:
            start = stack.pop()
            if start > (best[0] if best else -1):
                best = (start, pos)
        elif piece == "{":
            stack.append(-1)
        elif piece == "\\boxed{":
            stack.append(pos + len(piece))
        pos += len(piece)
    return None if best is None else text[best[0]:best[1]]


def _strip_extra_braces(move: str, levels: int = 2) -> str:
    r"""`{42}` -> `42`, `{{x + 1}}` -> `x + 1`: up to two extra brace levels around the whole move,
    as the authors strip them (we also require the outer pair to match: `{a}, {b}` stays). The
    move holds no closed box (it would be the last one), so the box below is the outer pair."""
    move = move.strip()
    for _ in range(levels):
        if not move.startswith("{") or last_balanced_box("\\boxed" + move) != move[1:-1]:
            break
        move = move[1:-1].strip()
    return move


def after_thinking(text: str) -> str:
    """The committed part of a reply: everything after the last `</think>` (all of it if none)."""
    return text.rsplit("</think>", 1)[-1]


def parse_action(text: str) -> str:
    r"""The move as the environment expects it, `\boxed{<move>}` (the paper's answer format): the
    last balanced box after the reasoning, stripped (`\boxed{{42}}` -> `\boxed{42}`); with no box
    the stripped reply goes through (the environment reminds the agent of the format)."""
    answer = after_thinking(text)
    move = last_balanced_box(answer)
    return answer.strip() if move is None else "\\boxed{" + _strip_extra_braces(move) + "}"


_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)
_XML_FUNCTION = re.compile(r"<function=([^>\s]+)>(.*?)</function>", re.S)
_XML_PARAMETER = re.compile(r"<parameter=([^>\s]+)>(.*?)</parameter>", re.S)
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.S)


def _json(raw: str, default: Any = None) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return default


def parse_tool_calls(text: str) -> list[dict]:
    """Every tool call after the reasoning, in order, as `{"name": str, "arguments": dict}`: the
    JSON form `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (Qwen3, Hermes; arguments
    may be a JSON string) and the XML form `<tool_call><function=NAME><parameter=KEY>VALUE
    </parameter>...</function></tool_call>` (Qwen3-Coder); a block that is neither is skipped.
    The project's one tool-call parser (suites/toolbench.py scores benchmark replies with it)."""
    calls = []
    for block in _TOOL_CALL.findall(after_thinking(text)):
        functions = _XML_FUNCTION.findall(block)
        # a parameter is JSON when it parses (numbers, lists), else text
        for name, params in functions:
            args = {k: v.strip("\n") for k, v in _XML_PARAMETER.findall(params)}
            calls.append({"name": name, "arguments": {k: _json(v, v) for k, v in args.items()}})
        call = None if functions else _json(block.strip())
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            continue
        arguments = call.get("arguments", call.get("parameters", {}))
        arguments = _json(arguments) if isinstance(arguments, str) else arguments
        if isinstance(arguments, dict):
            calls.append({"name": call["name"], "arguments": arguments})
    return calls


def tool_action(text: str) -> str:
    """Normalise a tool-use reply to the action text ToolEnv.step() expects: the last `<answer>`
    alone (it outranks tool calls, as in the authors' loop), else one canonical JSON block per
    tool call, else the stripped reply (the environment answers it with a format reminder)."""
    body = after_thinking(text)
    answers = _ANSWER.findall(body)
    if answers:
        return "<answer>" + answers[-1].strip() + "</answer>"
    calls = parse_tool_calls(text)
    blocks = ["<tool_call>" + json.dumps(c, ensure_ascii=False) + "</tool_call>" for c in calls]
    return "\n".join(blocks) if blocks else body.strip()


def malformed_tool_call(text: str) -> bool:
    """A reply that tries a `<tool_call>` but yields no call that parses and gives no answer."""
    body = after_thinking(text)
    return "<tool_call>" in body and not parse_tool_calls(text) and not _ANSWER.search(body)


def first_user_message(observation: str, hint: str | None, setting: str) -> str:
    """The first user message (a hinted play sees the hint appended): preamble, observation and the
    paper's answer-format sentence as the authors lay them out (games); the instruction (tools)."""
    if hint:
        observation = f"{observation}\n\nHINT: {hint}"
    if setting == "tool":
        return observation
    return f"{PREAMBLE}\nObservation: {observation}\n{ANSWER_FORMAT}"  # the authors' layout


# ----------------------------------------------------------------------------------------------
# ALGO: episode records


@dataclass
class EpisodeSpec:
    """One play to run: which environment, with which seed, hinted or not, on which live handle."""
    env_id: str
    seed: int
    hint: str | None
    handle: Any  # reset/step/tools/close (a sandbox EnvHandle or anything that quacks like one)


@dataclass
class Episode:
    """A finished play. token_ids, mask and logprobs have one entry per token (prompt included)."""
    env_id: str
    seed: int
    hinted: bool
    turns: int = 0                                   # agent replies generated
    actions: list[str] = field(default_factory=list)  # normalised actions sent to step(), in order
    token_ids: list[int] = field(default_factory=list)
    prompt_len: int = 0
    mask: list[int] = field(default_factory=list)      # 1 = reply token (trained)
    logprobs: list[float] = field(default_factory=list)  # engine's, 0.0 where mask is 0
    rewards: list[float] = field(default_factory=list)   # one per step()
    ret: float = 0.0
    status: str = ""  # terminated | truncated | turn_limit | context | env_error
    error: str | None = None
    messages: list[dict] = field(default_factory=list)  # the environment's and the agent's turns
    # the first prompt as the agent read it, decoded from its tokens: the chat template's system
    # message (with the tool block a template that ignores tools= gets) and the first observation
    rendered_prompt: str = ""
    # strip_thinking_history: one (token_ids, mask, logprobs) per turn, each its own context
    turn_samples: list[tuple] = field(default_factory=list)
    masked_replies: int = 0  # replies masked out of the loss as malformed tool calls

    def extend(self, ids: list[int], logprobs: list[float] | None = None) -> None:
        """Append a reply (mask 1, the engine's log-probs) or, without log-probs, template
        tokens."""
        self.token_ids += ids
        self.mask += [0 if logprobs is None else 1] * len(ids)
        self.logprobs += [0.0] * len(ids) if logprobs is None else [float(x) for x in logprobs]


def episode_return(rewards: list[float], terminated: bool) -> float:
    """The return Eq. (3) averages: the last reward clipped to [-1, 1] if that step
    terminated, else 0."""
    if not terminated or not rewards:
        return 0.0
    return max(-1.0, min(1.0, float(rewards[-1])))


# ----------------------------------------------------------------------------------------------
# INFRA: chat-template deltas, tokenized without letting contents inject special tokens


def turn_end(tokenizer) -> tuple[str, int]:
    """The chat template's end-of-turn marker as (text, token id): the first special token the
    template writes after an assistant reply (`<|im_end|>`, `<|eot_id|>`, ...), else the EOS. A
    reply ends there, whatever the EOS is (a base model's `<|endoftext|>` ends a document)."""
    mark = f"\x00reply-{secrets.token_hex(8)}\x00"
    text = tokenizer.apply_chat_template([{"role": "user", "content": "Hi."},
                                          {"role": "assistant", "content": mark}], tokenize=False)
    special = set(tokenizer.all_special_ids) | set(getattr(tokenizer, "added_tokens_decoder", {}))
    for t in tokenizer.encode(text.split(mark, 1)[-1], add_special_tokens=False):
        piece = tokenizer.decode([t], skip_special_tokens=False)
        if t in special:
            return piece, t
        if piece.strip():  # plain text first: this template has no end-of-turn token
            break
    return tokenizer.eos_token, tokenizer.eos_token_id


# A template that ignores `tools=` (the transcript would never show the agent its tools) gets
# them in the Qwen3 / Hermes form that parse_tool_calls reads, written in our own words.
TOOL_BLOCK = ("# Tools\n\nYou can call the functions below. Their JSON signatures are inside "
              "<tools></tools>:\n<tools>\n{tools}\n</tools>\n\nTo call one, write a JSON object "
              "with its name and arguments inside <tool_call></tool_call> tags:\n<tool_call>\n"
              '{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>')
_TOOL_PLACES: dict[str, str] = {}  # chat template -> "native" | "system" | "user"


def _with_tool_block(messages: list[dict], tools: list[dict], place: str) -> list[dict]:
    """The Hermes form by hand: the tool block opens the system message (or, for a template
    without a system role, the first user message); consecutive tool results become
    <tool_response> blocks of one user turn."""
    out: list[dict] = []
    for i, m in enumerate(messages):
        if m["role"] != "tool":
            out.append(dict(m))
            continue
        wrapped = f"<tool_response>\n{m['content']}\n</tool_response>"
        if i and messages[i - 1]["role"] == "tool":
            out[-1]["content"] += "\n" + wrapped
        else:
            out.append({"role": "user", "content": wrapped})
    block = TOOL_BLOCK.format(tools="\n".join(json.dumps(t, ensure_ascii=False) for t in tools))
    if place == "system" and not (out and out[0]["role"] == "system"):
        out.insert(0, {"role": "system", "content": block})
    else:
        first = 0 if place == "system" else next(i for i, m in enumerate(out)
                                                 if m["role"] == "user")
        out[first]["content"] = block + "\n\n" + out[first]["content"]
    return out


def _tool_place(tokenizer, tools: list[dict], kwargs: dict) -> str:
    """Where the tools go for this template, decided once per template: "native" when rendering
    with and without `tools=` differs, else where a hand-written block shows up ("system", then
    "user"); a ValueError naming the template when it shows up nowhere."""
    key = str(tokenizer.chat_template)
    if key in _TOOL_PLACES:
        return _TOOL_PLACES[key]
    probe, shown = [{"role": "user", "content": "Hi."}], json.dumps(tools[0], ensure_ascii=False)

    def render(messages, with_tools):
        return tokenizer.apply_chat_template(messages, tools=with_tools, tokenize=False,
                                             add_generation_prompt=True, **kwargs)
    place = "native" if render(probe, tools) != render(probe, None) else None
    for where in ([] if place else ["system", "user"]):
        try:
            if shown in render(_with_tool_block(probe, tools, where), None):
                place = where
                break
        except Exception:  # e.g. a template that raises on the system role
            continue
    name = f"{tokenizer.name_or_path or type(tokenizer).__name__}'s chat template"
    if place is None:
        raise ValueError(f"{name} ignores tools= and shows neither a system message nor a tool "
                         "block in the first user message: the agent could not see its tools")
    if place != "native":
        log.warning("%s ignores tools=: the tools go in a Qwen3/Hermes block in the %s message",
                    name, place)
    _TOOL_PLACES[key] = place
    return place


def render_chat(tokenizer, messages: list[dict], *, tools: list[dict] | None = None,
                generation_prompt: bool = True, **kwargs) -> str:
    """apply_chat_template as text, with the tools shown even by a template that drops them."""
    place = _tool_place(tokenizer, tools, kwargs) if tools else "native"
    if place != "native":
        messages, tools = _with_tool_block(messages, tools, place), None
    return tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=False,
                                         add_generation_prompt=generation_prompt, **kwargs)


class _Renderer:
    """Token deltas of one episode's conversation; the token list is the source of truth. Each
    turn the conversation is rendered with the last reply replaced by a marker, without and with
    the new messages; the tail after the marker without them (`<|im_end|>\\n`) must be a prefix of
    the tail with them, and the rest is the delta. Looking only past the marker survives templates
    that rewrite history (Qwen3 drops earlier reasoning). A reply that stopped on the template's
    end of turn does not get it twice; one that stopped on another EOS gets it as mask-0 tokens.
    Markers carry a random nonce (no output can forge one); contents are tokenized with special
    tokens off, so an environment that prints `<|im_end|>` cannot inject chat structure."""

    def __init__(self, tokenizer, tools: list[dict], enable_thinking: bool | None,
                 eot: tuple[str, int] = ("", -1)):  # turn_end(tokenizer); deltas need it
        nonce = secrets.token_hex(8)
        self.reply_mark = f"\x00reply-{nonce}\x00"       # stands in for the last reply
        self.content_mark = f"\x00content-{nonce}-{{}}\x00"  # for untrusted message contents
        self.tok, self.tools, self.eot_text, self.eot_id = tokenizer, tools, *eot
        self.kwargs = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
        self.short_ok: bool | None = None  # may a short history stand in for the full one?

    def render(self, messages: list[dict], generation_prompt: bool) -> str:
        return render_chat(self.tok, messages, tools=self.tools,
                           generation_prompt=generation_prompt, **self.kwargs)

    def marked(self, messages: list[dict]) -> list[dict]:
        return [dict(m, content=self.content_mark.format(i)) for i, m in enumerate(messages)]

    def encode(self, text: str, contents: list[str]) -> list[int]:
        """Tokenize rendered text whose i-th content mark stands for contents[i]."""
        ids: list[int] = []
        for i, content in enumerate(contents):
            mark = self.content_mark.format(i)
            assert text.count(mark) == 1, "the chat template duplicated or dropped a message"
            scaffold, text = text.split(mark)
            ids += self.tok.encode(scaffold, add_special_tokens=False)
            ids += self.tok.encode(content, add_special_tokens=False, split_special_tokens=True)
        return ids + self.tok.encode(text, add_special_tokens=False)

    def prompt(self, messages: list[dict]) -> list[int]:
        """Tokens of a whole prompt (the conversation so far plus the generation prompt)."""
        text = self.render(self.marked(messages), True)
        return self.encode(text, [m["content"] for m in messages])

    def _tails(self, history: list[dict], new: list[dict]) -> tuple[str, str]:
        """The rendered text after the last reply, without and with the new messages."""
        base = history[:-1] + [dict(history[-1], content=self.reply_mark)]
        before, after = self.render(base, False), self.render(base + self.marked(new), True)
        assert before.count(self.reply_mark) == 1 and after.count(self.reply_mark) == 1
        return before.split(self.reply_mark)[1], after.split(self.reply_mark)[1]

    def delta(self, history: list[dict], new: list[dict], reply_stop: int | None) -> list[int]:
        """Tokens the template puts after the last reply of `history`, through `new` messages and
        the next generation prompt. Rendering the whole history every turn costs O(turns^2) per
        episode, so the first delta also renders a short history (through the first user turn,
        then the last reply); if both tails agree, later turns render only the short one."""
        first_user = next((i for i, m in enumerate(history) if m["role"] == "user"), 0)
        short = history[:first_user + 1] + history[-1:]
        tails = self._tails(short if self.short_ok and len(short) < len(history) else history, new)
        if self.short_ok is None and len(short) < len(history):
            self.short_ok = tails == self._tails(short, new)
        tail_before, tail_after = tails
        if not tail_after.startswith(tail_before) or self.eot_text not in tail_before:
            raise ValueError("chat template: the text after an assistant reply changes when a "
                             f"message follows ({tail_before!r} vs {tail_after[:80]!r}); "
                             "cannot compute observation tokens exactly")
        if reply_stop == self.eot_id:  # the model closed its turn itself: do not add a second one
            tail_after = tail_after[tail_before.index(self.eot_text) + len(self.eot_text):]
        return self.encode(tail_after, [m["content"] for m in new])


def prompt_ids(tokenizer, messages: list[dict], *, tools: list[dict] | None = None,
               enable_thinking: bool | None = None) -> list[int]:
    """Chat-template tokens of a prompt (the messages plus the generation prompt) in which no
    message content can become a special token: the project's one tokenizer path for prompts
    (play's first prompts, sampling.Sampler's designer and hint prompts)."""
    return _Renderer(tokenizer, tools or [], enable_thinking).prompt(messages)


# ----------------------------------------------------------------------------------------------
# ALGO: the batched multi-turn loop


def fault(result: tuple) -> str | None:
    """The kind of environment fault that ended a reset/step call, else None. The sandbox and
    infra/imported.py's handles mark it on the result object (a sandbox.Fault, its `fault`
    attribute), out of the environment's reach: whatever its info holds ("error" keys too) is its
    own and passes through untouched."""
    return getattr(result, "fault", None)


def _finish(ep: Episode, status: str, error: str | None = None, terminated: bool = False) -> None:
    ep.status, ep.error = status, error
    ep.ret = 0.0 if status == "env_error" else episode_return(ep.rewards, terminated)


def _start(spec: EpisodeSpec, reset: tuple, tokenizer, setting: str, enable_thinking: bool | None,
           eot) -> tuple[Episode, _Renderer | None]:
    """An episode from its environment's reset (obs, info), with its first prompt and renderer."""
    ep = Episode(env_id=spec.env_id, seed=spec.seed, hinted=bool(spec.hint))
    if kind := fault(reset):
        _finish(ep, "env_error", kind)
        return ep, None
    obs, _ = reset
    ep.messages = [{"role": "user", "content": first_user_message(obs, spec.hint, setting)}]
    tools = list(spec.handle.tools()) if setting == "tool" else []
    renderer = _Renderer(tokenizer, tools, enable_thinking, eot)
    ep.extend(renderer.prompt(ep.messages))
    ep.prompt_len = len(ep.token_ids)
    ep.rendered_prompt = tokenizer.decode(ep.token_ids)
    return ep, renderer


def _start_all(specs: list[EpisodeSpec], reset_many: Callable | None, tokenizer, setting: str,
               thinking: dict, eot) -> tuple[list[Episode], list]:
    """Every spec's environment reset (one round trip with reset_many) and its episode started;
    thinking[hinted] is the enable_thinking of its prompts."""
    if reset_many and specs:
        resets = reset_many([s.handle for s in specs], [s.seed for s in specs])
    else:
        resets = [s.handle.reset(seed=s.seed) for s in specs]
    started = [_start(s, r, tokenizer, setting, thinking[bool(s.hint)], eot)
               for s, r in zip(specs, resets)]
    return [ep for ep, _ in started], [r for _, r in started]


def _add_reply(ep: Episode, completion, tokenizer, stops: set, check_calls: bool,
               keep_turn: bool) -> tuple:
    """Append one sampled reply (tokens, mask 1, log-probs) and its message, and with keep_turn
    the context so far as its own training record (Episode.turn_samples); returns (its stop
    token or None, its text, whether it is a malformed tool call, then masked out)."""
    ids, start = list(completion.token_ids), len(ep.token_ids)
    assert len(completion.logprobs) == len(ids), "engine returned one log-prob per token"
    ep.turns += 1
    ep.extend(ids, completion.logprobs)
    stop = ids[-1] if ids and ids[-1] in stops else None
    text = tokenizer.decode(ids if stop is None else ids[:-1], skip_special_tokens=False)
    ep.messages.append({"role": "assistant", "content": text})
    malformed = check_calls and malformed_tool_call(text)
    if malformed:  # no loss on a reply the environment cannot run (its tokens stay)
        ep.mask[start:], ep.logprobs[start:] = [0] * len(ids), [0.0] * len(ids)
        ep.masked_replies += 1
    if keep_turn:
        ep.turn_samples.append((list(ep.token_ids), list(ep.mask), list(ep.logprobs)))
    return stop, text, malformed


def _without_thinking(messages: list[dict]) -> list[dict]:
    """The conversation with the reasoning of earlier replies removed (what a thinking Qwen3
    sees of its own history: the text after the last </think>)."""
    return [dict(m, content=after_thinking(m["content"]).lstrip("\n"))
            if m["role"] == "assistant" else m for m in messages]


def _observe(ep: Episode, renderer: _Renderer, result: tuple, stop: int | None, malformed: bool, *,
             setting: str, max_turns: int, max_context: int, strip_thinking_history: bool) -> None:
    """Record one step's result and append its observation (tokens with mask 0), or end the
    episode: on a fault, at the environment's end, out of turns (on the last reply, no dangling
    observation), or with no room left to reply."""
    if kind := fault(result):
        return _finish(ep, "env_error", kind)
    obs, reward, terminated, truncated, info = result
    ep.rewards.append(float(reward))
    if terminated or truncated:
        return _finish(ep, "terminated" if terminated else "truncated", terminated=terminated)
    if ep.turns >= max_turns:
        return _finish(ep, "turn_limit")
    outputs = info.get("tool_outputs") if setting == "tool" and isinstance(info, dict) else None
    new = [{"role": "tool", "content": str(out)} for out in outputs] if outputs else \
        [{"role": "user", "content": str(obs)}]
    if malformed:
        new[-1]["content"] += f"\n\n{FORMAT_HINT}"
    if strip_thinking_history:  # a fresh context: the whole history without its reasoning
        context = renderer.prompt(_without_thinking(ep.messages + new))
        if len(context) >= max_context:
            return _finish(ep, "context")
        ep.token_ids, ep.mask, ep.logprobs = [], [], []
        ep.extend(context)
    else:
        delta = renderer.delta(ep.messages, new, stop)
        if len(ep.token_ids) + len(delta) >= max_context:
            return _finish(ep, "context")
        ep.extend(delta)
    ep.messages += new


def _step_each(handles: list, actions: list) -> list:
    """step_many's default: each handle's own step, in turn (plain environments)."""
    return [h.step(a) for h, a in zip(handles, actions)]


def play(specs: list[EpisodeSpec], *, stream, tokenizer,
         step_many: Callable | None = None, reset_many: Callable | None = None,
         setting: str = "games", max_turns: int = 25,
         max_context: int = 32768, max_new_tokens: int = 8192,
         enable_thinking: bool | None = None, strip_thinking_history: bool = False,
         mask_malformed: bool = False, hinted_thinking: bool | None = None) -> list[Episode]:
    """Play every spec to its end. Returns one Episode per spec, in order. Paper limits (its
    training setup): 25 turns, 32,768-token context, 8,192 new tokens per turn (fewer when the
    context is nearly full). `stream`: the policy's requests (infra/stream.py's Stream),
    submit(key, tokens, max_new_tokens), collect() -> [(key, Completion)], pending, serve(fn);
    an episode's next turn goes in as soon as its environment answers, under the key (episode,
    turn).
    step_many(handles, actions) / reset_many(handles, seeds): one round trip for the batch (the
    sandbox's; default: each handle's own). strip_thinking_history (the authors' thinking 8B games
    agent): each turn's context is re-rendered with earlier `<think>` blocks removed and is its own
    training record (`Episode.turn_samples`, sharing the episode's advantage). hinted_thinking:
    enable_thinking of the hinted plays (None: as the others; the authors' 8B games: False).
    mask_malformed (tool use, the authors' filter): a reply whose `<tool_call>` does not parse gets
    mask 0, and the next observation ends with FORMAT_HINT, the expected call format."""
    assert setting in ("games", "tool"), setting
    eot = turn_end(tokenizer)
    thinking = {False: enable_thinking,
                True: enable_thinking if hinted_thinking is None else hinted_thinking}
    episodes, renderers = _start_all(specs, reset_many, tokenizer, setting, thinking, eot)
    stops = {tokenizer.eos_token_id, eot[1]}  # the engine stops on either
    caps = {}

    def ask(i: int) -> None:  # INFRA: the episode's next reply, unless no room is left for one
        # The authors' margin: an episode with CONTEXT_MARGIN tokens or fewer left ends, and a
        # reply may take the room left minus the margin.
        caps[i] = min(max_new_tokens, max_context - len(episodes[i].token_ids) - CONTEXT_MARGIN)
        if caps[i] <= 0:
            return _finish(episodes[i], "context")
        stream.submit((i, episodes[i].turns + 1), episodes[i].token_ids, caps[i])
    for i in [i for i, ep in enumerate(episodes) if not ep.status]:
        ask(i)
    while stream.pending:  # ALGO: each episode: reply, step its environment, observe
        stepping = []
        for (i, _), completion in stream.collect():
            ep = episodes[i]
            stop, text, malformed = _add_reply(ep, completion, tokenizer, stops,
                                               mask_malformed and setting == "tool",
                                               keep_turn=strip_thinking_history)
            if completion.finish_reason != "stop":  # EOS-less: no action from a cut-off thought
                _finish(ep, "context" if caps[i] < max_new_tokens else "truncated")
            else:
                ep.actions.append(tool_action(text) if setting == "tool" else parse_action(text))
                stepping.append((i, stop, malformed))
        handles = [specs[i].handle for i, _, _ in stepping]
        actions = [episodes[i].actions[-1] for i, _, _ in stepping]
        # INFRA: the environments step while a TP member keeps serving its group (serve)
        results = stream.serve(lambda: (step_many or _step_each)(handles, actions))
        for (i, stop, malformed), result in zip(stepping, results):
            _observe(episodes[i], renderers[i], result, stop, malformed, setting=setting,
                     max_turns=max_turns, max_context=max_context,
                     strip_thinking_history=strip_thinking_history)
            if not episodes[i].status:
                ask(i)
    return episodes
