"""The tool-use environment contract: the `ToolEnv` base class of SPADE's tool-use setting.

SPADE (arXiv 2608.19197, Sec. 4.2): in the tool-use setting the Environment Designer writes a
subclass of `ToolEnv`: tools over a hidden `self.state`, and 3-5 instructions, each an
(instruction text, predicate over the state) pair. This base class is what the designer's tool
prompt (`data/prompts/tool_spec.txt`) describes; it runs the turn rules so a designer cannot get
them wrong. It is not a security layer: it runs inside the sandbox worker, where `sandbox.py`
injects it into the environment's namespace (the designer never imports it).

Turn rules, as in the authors' base class: tool calls are free (they never touch the turn budget);
an `<answer>` turn and a malformed turn (no answer, no call that parses) each use one of
`max_turns` (10, theirs). An answer outranks tool calls in the same action. A premature or wrong
answer gets feedback naming the pending instruction, reward 0, and play continues. When the last
instruction completes, the tool output says so and asks for `<answer>done</answer>`.

The contract's self-check, `self_check(env, seed)`, is what validation requires of a tool
environment (sandbox.Sandbox.validate calls it in a fresh worker for seeds 0, 1, 2): reset(seed)
gives 3-5 instructions whose predicates are all False; replaying solution() one call per step
completes them without ending the episode; `<answer>done</answer>` then ends it with reward 1.0.
It runs in the worker beside the environment's own code, so it is a check of the designer's work,
not a security check (the environment's step() decides its reward anyway); the sandbox re-checks
its reply like any other and compares the transcripts of two fresh instances.

Deviations from the authors' code: 1. after every tool call the base class checks the
instructions' predicates in order and appends the next instruction (or the completion marker) to
the tool output (authors: each tool method calls its own `_advance_if_done`). 2. Solvability is
this executable replay (authors: an LLM self-audit).

Copy it beside sandbox.py for tool use (the sandbox's zygote preloads it; a worker cannot read the
repository). Stdlib only. Test: python -m pytest -q tests/test_tool_use.py tests/test_sandbox.py
"""
import json
import random
import re

# The action text is agent.tool_action's canonical form (one JSON `<tool_call>` block per call, or
# one `<answer>`). This module runs inside the sandbox worker and cannot import agent.py, so it
# decodes that form here; agent.parse_tool_calls alone reads raw model output.
_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)
_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.S)
FORMAT_REMINDER = ("Invalid turn. Call tools with <tool_call>{\"name\": ..., \"arguments\": {...}}"
                   "</tool_call> (one or more), or finish with <answer>done</answer>.")
ALL_DONE = "[ALL INSTRUCTIONS COMPLETE] Now submit <answer>done</answer>."


class ToolEnv:
    """Tool-use environment: tools over hidden `self.state`, 3-5 instructions with predicates."""
    TOOLS: list = []

    def __init__(self, max_turns: int = 10):
        self.max_turns = max_turns
        self.state, self.instructions, self._done, self._turn = {}, [], 0, 0

    def setup(self, rng):  # subclasses: fill self.state and self.instructions from rng
        raise NotImplementedError

    def solution(self) -> list:  # subclasses: the tool calls that complete every instruction
        return []

    def tools(self) -> list[dict]:
        fns = [t.get("function", t) if isinstance(t, dict) else {} for t in self.TOOLS]
        empty = {"type": "object", "properties": {}}
        return [{"type": "function",
                 "function": {"name": f.get("name"), "description": f.get("description", ""),
                              "parameters": f.get("parameters", empty)}} for f in fns]

    def reset(self, seed=None):
        self.state, self.instructions, self._done, self._turn = {}, [], 0, 0
        self.setup(random.Random(seed))
        return self.instructions[0][0], {"tools": self.tools()}

    def call(self, name, arguments) -> str:
        """Dispatch one tool call; every error comes back as text, never raised."""
        try:
            if isinstance(arguments, str):
                arguments = json.loads(arguments) if arguments.strip() else {}
            names = {t["function"]["name"] for t in self.tools()}
            if name not in names or not callable(getattr(self, f"tool_{name}", None)):
                return f"Error: unknown tool {name!r}."
            if not isinstance(arguments, dict):
                return "Error: arguments must be a JSON object."
            out = getattr(self, f"tool_{name}")(**arguments)
            return out if isinstance(out, str) else json.dumps(out, default=str)
        except Exception as e:  # noqa: BLE001 - tool errors are observations
            return f"Error: {type(e).__name__}: {e}"

    def _advance(self) -> str:
        """Mark every instruction whose predicate now holds as done (in order); the text that tells
        the agent: the next instruction, or the completion marker after the last one."""
        note = ""
        while self._done < len(self.instructions):
            try:
                if not self.instructions[self._done][1](self.state):
                    break
            except Exception:  # noqa: BLE001 - a raising predicate counts as unmet
                break
            self._done += 1
            note = (f"\n\nNext instruction: {self.instructions[self._done][0]}"
                    if self._done < len(self.instructions) else f"\n\n{ALL_DONE}")
        return note

    def _pending(self) -> str:
        """Feedback on an answer given before every instruction is done."""
        if self._done >= len(self.instructions):
            return f"Not accepted: the only final answer is <answer>done</answer>. {ALL_DONE}"
        return (f"Not finished: instruction {self._done + 1} of {len(self.instructions)} is still "
                f"pending: \"{self.instructions[self._done][0]}\" Complete it with the tools "
                "before submitting <answer>done</answer>.")

    def step(self, action):
        self._turn = getattr(self, "_turn", 0)             # tolerate a missing super().__init__
        answers, outputs = _ANSWER_RE.findall(action), []
        for raw in [] if answers else _CALL_RE.findall(action):        # an answer outranks calls
            try:
                obj = json.loads(raw)
                name, args = obj["name"], obj.get("arguments", {})
            except Exception:  # noqa: BLE001
                continue
            outputs.append(self.call(name, args) + self._advance())
        if outputs:                                                    # tool calls are free
            return "\n".join(outputs), 0.0, False, False, {"tool_outputs": outputs}
        self._turn += 1
        truncated = self._turn >= getattr(self, "max_turns", 10)
        if not answers:
            return FORMAT_REMINDER, -0.1, False, truncated, {"tool_outputs": []}
        if answers[-1].strip().lower() == "done" and self._done >= len(self.instructions):
            return "All instructions completed.", 1.0, True, False, {"tool_outputs": []}
        return self._pending(), 0.0, False, truncated, {"tool_outputs": []}


class ContractError(ValueError):
    """A tool environment breaks the contract (validation's `unsolvable`)."""


def self_check(env: ToolEnv, seed: int) -> list:
    """The contract from reset(seed), by replaying solution(): the transcript [first observation,
    [observation, reward] per step]; raises ContractError on a breach. Errors of the environment's
    own code (a raising reset, step or solution) propagate as they are."""
    obs, _ = env.reset(seed=seed)
    n = len(env.instructions)
    if not 3 <= n <= 5:
        raise ContractError(f"seed {seed}: {n} instructions (need 3-5)")
    held, raised = [], []
    for i, (_, pred) in enumerate(env.instructions):
        try:
            if pred(env.state):
                held.append(i)
        except Exception:  # noqa: BLE001 - a predicate must not raise at reset
            raised.append(i)
    if held or raised:
        raise ContractError(f"seed {seed}: predicates true {held} / raising {raised} at reset")
    trace = [obs]
    for call in list(env.solution()):                                  # one call per step
        if type(call) is not dict or type(call.get("name")) is not str:
            raise ContractError(f"seed {seed}: solution() step {call!r:.60} is not a call")
        payload = {"name": call["name"], "arguments": call.get("arguments", {})}
        o, reward, terminated, _, _ = env.step(f"<tool_call>{json.dumps(payload)}</tool_call>")
        trace.append([o, reward])
        if terminated:
            raise ContractError(f"seed {seed}: episode ended during the solution replay")
    o, reward, terminated, _, _ = env.step("<answer>done</answer>")
    if not terminated or reward != 1.0:
        raise ContractError(f"seed {seed}: replaying solution() ends with reward {reward}")
    return trace + [[o, reward]]
