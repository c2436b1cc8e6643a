"""toolbench.py: tau2-bench end to end on scripted models (the package's own domains, orchestrator
and evaluator; a scripted user, and tau2's user simulator on a loopback OpenAI-compatible endpoint),
the pass^k arithmetic, and the clear failures when a tool-use suite cannot run."""
import json

import pytest

import eval as E
from scripted import ScriptedSampler
from suites import toolbench as T

SAMPLING = {"temperature": 0.0, "top_p": 1.0, "max_new_tokens": 16, "seed": 0}
TASKS = {"8", "9"}  # airline tasks whose expected actions write the database (4 and 2 actions)


def test_pass_hat_k_hand_computed():
    # task 1: 2 of 4 trials succeed -> pass^1 = 0.5, pass^2 = C(2,2)/C(4,2) = 1/6; task 2: 4 of 4 -> 1, 1
    assert T.pass_hat_k([2, 4], 4, 1) == pytest.approx(0.75)
    assert T.pass_hat_k([2, 4], 4, 2) == pytest.approx((1 / 6 + 1) / 2)
    assert T.pass_hat_k([0, 3], 4, 4) == 0.0


@pytest.fixture(scope="module")
def airline():
    return {t.id: t for t in T.tau2_tasks("airline") if t.id in TASKS | {"2"}}


@pytest.fixture(autouse=True)
def scripted_users(monkeypatch):
    """A callable `user` of run_tau2 (fn(task's user instructions, tau2 messages the user has
    seen) -> text) plays tau2's user simulator in place of an LLM endpoint."""
    endpoint_user = T._tau2_user

    def make(user_tools, instructions, user):
        if not callable(user):
            return endpoint_user(user_tools, instructions, user)
        from tau2.data_model.message import MultiToolMessage, UserMessage
        from tau2.user.user_simulator import UserSimulator

        class ScriptedUser(UserSimulator):
            def _generate_next_message(self, message, state):
                new = message.tool_messages if isinstance(message, MultiToolMessage) else [message]
                state.messages.extend(new)
                reply = UserMessage(role="user", content=user(instructions, state.messages))
                state.messages.append(reply)
                return reply, state
        return ScriptedUser(tools=user_tools, instructions=instructions, llm="scripted")
    monkeypatch.setattr(T, "_tau2_user", make)


def scripted_user(tasks):
    """Names its task on the first turn (so the scripted agent can look it up), then ends the chat."""
    def user(instructions, messages):
        if any(m.role == "user" for m in messages):
            return "Thanks. ###STOP###"
        return "Hello, I am customer %s." % next(i for i, t in tasks.items() if str(t.user_scenario) == instructions)
    return user


def oracle_agent(tasks):
    """Replays the task's expected actions one call per turn, then tells the required information."""
    def reply(messages, k):
        task = tasks[next(m["content"] for m in messages if m["role"] == "user").split("customer ")[1].rstrip(".")]
        done = sum(m["role"] == "tool" for m in messages)
        actions = task.evaluation_criteria.actions
        if done < len(actions):
            return "<tool_call>%s</tool_call>" % json.dumps({"name": actions[done].name, "arguments": actions[done].arguments})
        return "Done. " + " ".join(task.evaluation_criteria.communicate_info or [])
    return ScriptedSampler(reply)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_tau2_end_to_end_scripted_user(airline):
    metrics, records = T.run_tau2(oracle_agent(airline), user=scripted_user(airline), sampling=SAMPLING,
                                  domains=("airline",), trials=1, tasks=TASKS)
    assert metrics == {"tau2/airline/pass^1": 1.0, "tau2/airline/tasks": 2, "tau2/pass^1": 1.0}
    assert len(records) == 2 and all(r["reward"] == 1.0 for r in records)
    assert [m["role"] for m in records[0]["messages"]][:3] == ["assistant", "user", "assistant"]
    started = []  # right on the first trial of a task only: pass^1 = 1/2, pass^2 = 0

    def first_trial_only(messages, k):
        started.extend([1] if len(messages) == 3 else [])  # policy prompt, tau2's greeting, the customer's opening
        return oracle_agent(airline).fn(messages, k) if len(started) % 2 else "Sorry, I cannot help."

    metrics, _ = T.run_tau2(ScriptedSampler(first_trial_only), user=scripted_user(airline), sampling=SAMPLING,
                            domains=("airline",), trials=2, tasks={"9"})
    assert (metrics["tau2/airline/pass^1"], metrics["tau2/airline/pass^2"]) == (0.5, 0.0)
    silent = ScriptedSampler(lambda m, k: "I am sorry, I cannot help with that.")
    metrics, _ = T.run_tau2(silent, user=scripted_user(airline), sampling=SAMPLING, domains=("airline",), trials=1,
                            tasks={"8"})
    assert metrics["tau2/airline/pass^1"] == 0.0  # the database never changed


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_tau2_user_simulator_on_an_openai_endpoint(airline, tmp_path, openai_endpoint):
    """eval.py --suites tau2 --tau2_user_endpoint URL: tau2's own user simulator talks to the
    endpoint (a loopback server scripted like the user above); the oracle agent still wins."""
    def user(body):
        first = not any(m["role"] == "assistant" for m in body["messages"])
        text = "Hello, I am customer 2." if first else "Thanks. ###STOP###"
        return {"id": "u", "object": "chat.completion", "created": 0, "model": body["model"],
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": text}}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}

    url, seen = openai_endpoint(user)
    cfg = E.EvalConfig(suites="tau2", tau2_domains="airline", tau2_trials=1, limit=3, output_dir=str(tmp_path),
                       tau2_user_endpoint=url, tau2_user_model="usersim")
    results = E.evaluate(cfg, sampler=oracle_agent(airline))  # task 2's actions, whichever task runs
    assert results["metrics"]["tau2/airline/tasks"] == 3  # --limit: tasks 0, 1, 2; only task 2's database matches
    assert results["metrics"]["tau2/airline/pass^1"] == pytest.approx(1 / 3)
    assert seen and {b["model"] for b in seen} == {"usersim"} and seen[0]["messages"][0]["role"] == "system"
    assert results["sampling"]["tau2"] == {"n": 1, "temperature": 0.0, "top_p": 0.8, "top_k": 20,
                                           "max_new_tokens": 16384, "seed": 0}


def test_tau2_without_a_user_endpoint_says_what_is_missing(tmp_path):
    cfg = E.EvalConfig(suites="tau2", output_dir=str(tmp_path))
    with pytest.raises(E.MissingDataset, match="--tau2_user_endpoint"):
        E.evaluate(cfg, sampler=ScriptedSampler(lambda m, k: ""))
