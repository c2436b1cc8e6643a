"""acebench.py: the call decoder, the Normal checker's rules, the Special phrase checks, the Agent
scenario engine (on a stand-in checkout in tests/fixtures/acebench_repo) with scripted models and a
scripted or loopback user, the hand-computed scores, and the clear failures when a part is missing."""
import json
import re
from pathlib import Path

import pytest

from suites import acebench as A
import eval as E
from scripted import ScriptedSampler

FIXTURES = Path(__file__).parent / "fixtures"
DATA, REPO = FIXTURES / "acebench", FIXTURES / "acebench_repo"
SAMPLING = {"temperature": 0.0, "top_p": 1.0, "max_new_tokens": 16, "seed": 0}
WEATHER = {"name": "get_weather", "parameters": {"type": "dict", "required": ["city"], "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"}},
    "where": {"type": "object", "properties": {"country": {"type": "string"}, "stops": {"type": "array"}}}}}}


def check(reply, answer, functions=(WEATHER,), category="normal_atom_bool"):
    entry = {"function": list(functions), "answer": {"ground_truth": answer}}
    return A.score_normal(entry, reply, category)


def test_decoder_reads_literal_call_lists_only():
    assert A.decode_calls("<think>hmm</think>\n[get_weather(city='Paris', days=3)]") == [
        {"get_weather": {"city": "Paris", "days": 3}}]
    # ACEBench removes every whitespace before parsing, inside strings too; -n, tuples and names are literals
    assert A.decode_calls("[f(a='New York', b=-2, c=(1, 2), d=true), g()]") == [
        {"f": {"a": "NewYork", "b": -2, "c": (1, 2), "d": "true"}}, {"g": {}}]
    assert A.decode_calls("[f(n=2*3, s='a'+'b')]") == [{"f": {"n": 6, "s": "ab"}}]
    for bad in ("get_weather(city='Paris')", "[get_weather(city='Paris'), 3]", "[f(x=__import__('os').getcwd)]",
                "I would call [f()]"):
        with pytest.raises(ValueError):
            A.decode_calls(bad)
    # the agent-side decoder adds missing brackets, strips them, accepts one bare call
    assert A.decode_agent_calls("turn_on_wifi()") == [{"turn_on_wifi": {}}]
    assert A.decode_agent_calls("[a(x=1), b(y='z')]") == [{"a": {"x": 1}}, {"b": {"y": "z"}}]
    with pytest.raises(ValueError):
        A.decode_agent_calls("Sure: [turn_on_wifi()]")


def test_normal_checker_rules():
    gold = {"get_weather": {"city": "Paris", "days": 3}}
    assert check("[get_weather(city='Paris', days=3)]", gold) == (True, None)
    assert check("[get_weather(city='paris, France', days=3)]", gold)[0]  # standardized, then a substring
    assert check("[get_weather(city='Lyon', days=3)]", gold) == (False, "value_error: city")
    assert check("[get_weather(city='Paris', days=5)]", gold)[0]  # ACEBench type-checks top-level numbers only
    assert check("[get_weather(city='Paris', days='3')]", gold) == (False, "type_error: days")
    assert check("[get_weather(days=3)]", gold) == (False, "lack_args: city")
    assert check("[get_weather(city='Paris', days=3, tags=['x'])]", gold) == (False, "addition_args: tags")
    assert check("[get_weather(city='Paris'), get_weather(city='Rome')]", gold) == (False, "wrong number of functions")
    assert check("[get_forecast(city='Paris', days=3)]", gold) == (False, "function_mismatch")
    assert check("get_weather(city='Paris', days=3)", gold)[1].startswith("wrong_output_format")
    # lists: standardized strings, exact order; one of several possible answers suffices
    tags = [{"get_weather": {"city": "Oslo", "tags": ["Rain", "wind"]}}, {"get_weather": {"city": "Oslo", "tags": ["snow"]}}]
    assert check("[get_weather(city='Oslo', tags=['rain', 'WIND'])]", tags)[0]
    assert check("[get_weather(city='Oslo', tags=['snow'])]", tags)[0]
    assert not check("[get_weather(city='Oslo', tags=['wind', 'rain'])]", tags)[0]
    # dicts: key by key; a nested list is compared as text, after the decoder removed its spaces
    where = {"get_weather": {"city": "Oslo", "where": {"country": "Norway", "stops": ["Bergen"]}}}
    assert check("[get_weather(city='Oslo', where={'country': 'norway', 'stops': ['Bergen']})]", where)[0]
    assert not check("[get_weather(city='Oslo', where={'country': 'Norway'})]", where)[0]
    spaced = {"get_weather": {"city": "Oslo", "where": {"country": "Norway", "stops": ["Bergen city"]}}}
    assert not check("[get_weather(city='Oslo', where={'country': 'Norway', 'stops': ['Bergen city']})]", spaced)[0]
    # a function called twice: answer keys carry _1, _2 ...
    twice = {"get_weather": {"city": "Paris"}, "get_weather_1": {"city": "Rome"}}
    assert check("[get_weather(city='Rome'), get_weather(city='Paris')]", twice)[0]
    assert not check("[get_weather(city='Rome'), get_weather(city='Rome')]", twice)[0]


def test_special_phrase_checks():
    def special(category, truth, reply):
        return A.score_special({"answer": {"ground_truth": truth}}, reply, category)

    incomplete = {"set_alarm": ["time"]}
    assert special("special_incomplete", incomplete, '["Missing necessary parameters (time) for the api (set_alarm)"]') == (True, None)
    assert special("special_incomplete", incomplete, '["Missing necessary parameters (day) for the api (set_alarm)"]') == (
        False, "error_correction")
    assert special("special_incomplete", incomplete, "[set_alarm()]") == (False, "error_detection")
    wrong = {"time": ["25:99"]}
    assert special("special_error_param", wrong, '["There is incorrect value (25:99) for the parameters (time) in the '
                                                  'conversation history."]')[0]
    assert not special("special_error_param", wrong, '["There is incorrect value (7:00) for the parameters (time)"]')[0]
    assert special("special_irrelevant", "", "<think>no tool</think>Due to the limitations of the function, I cannot")[0]
    assert not special("special_irrelevant", "", "[get_weather(city='x')]")[0]


def test_hand_computed_scores():
    # conversations 0 (turns right, wrong) and 1 (right): 1 of 2 whole; process (1/2 + 1) / 2
    assert A.conversation_accuracy(["c_0_0", "c_0_1", "c_1_0"], [True, False, True]) == (0.5, 0.75)
    # milestones found in order; a milestone never made consumes the rest of the scan (ACEBench's)
    assert A.process_accuracy(["a", "b", "c"], ["a", "x", "c"]) == pytest.approx(1 / 3)
    assert A.process_accuracy(["a", "c"], ["a", "x", "c"]) == 1.0
    assert A.process_accuracy(["a", "b"], ["b"]) == 0.0
    assert A.process_accuracy([["a", "b"], ["b"]], ["b "]) == 1.0  # best alternative; whitespace stripped
    scores = {**{c: 0.5 for c in A.CATEGORIES["normal"]}, **{c: 1.0 for c in A.CATEGORIES["special"]},
              "agent_multi_step": 0.0, "agent_multi_turn": 0.5}
    groups = A.summary(scores)
    assert groups == pytest.approx({"normal": 0.5, "special": 1.0, "agent": 0.25,
                                    "overall": 0.578 * 0.5 + 0.2676 * 1.0 + 0.1545 * 0.25})
    assert A.summary({c: 1.0 for c in A.CATEGORIES["special"]}) == {"special": 1.0}  # no overall from part


def test_state_check():
    want = [{"BaseApi": {"wifi": True}}, {"MessageApi": {"inbox": {"1": "a", "2": "b"}}}]
    assert A.state_error([{"BaseApi": {"wifi": True}}, {"MessageApi": {"inbox": {"1": "a", "2": "b"}}}], want) is None
    assert A.state_error([{"BaseApi": {"wifi": True}}, {"MessageApi": {"inbox": {"1": "a"}}}], want) == "MessageApi.inbox differs"
    assert A.state_error([{"BaseApi": {"wifi": False}}, {"MessageApi": {"inbox": {}}}], want) == "BaseApi.wifi differs"
    assert A.state_error([{"BaseApi": {"wifi": True}}], want) == "wrong number of classes"
    assert A.state_error([], want) == "wrong number of classes"


def single_turn_oracle(right: set):
    """Answers the fixture questions; ids outside `right` get a wrong answer."""
    answers = {
        "Wake me at 7:30": ("normal_atom_bool_0", "[set_alarm(time='07:30', repeat=True)]"),
        "Weather in Paris for 3": ("normal_atom_bool_1", "[get_weather(city='Paris', days=3)]"),
        "Paris and in Rome": ("normal_single_turn_parallel_function_0", "[get_weather(city='Paris'), get_weather(city='Rome')]"),
        "In imperial": ("normal_multi_turn_user_adjust_0_1", "[get_weather(city='Oslo', units='imperial')]"),
        "Weather in Oslo": ("normal_multi_turn_user_adjust_0_0", "[get_weather(city='Oslo')]"),
        "Ann's trip": ("normal_multi_turn_user_adjust_1_0", "[plan_trip(traveler='Ann', stay={'start': '06-03', 'nights': 2})]"),
        "at home": ("normal_preference_0", "[get_weather(city='Lisbon')]"),
        "Set an alarm.": ("special_incomplete_0", '["Missing necessary parameters (time) for the api (set_alarm)"]'),
        "25:99": ("special_error_param_0", '["There is incorrect value (25:99) for the parameters (time) in the conversation history."]'),
        "taxi": ("special_irrelevant_0", '["Due to the limitations of the function, I cannot solve this problem."]'),
    }

    def reply(messages, k):
        ident, text = next(v for key, v in answers.items() if key in messages[-1]["content"])
        return text if ident in right else "[get_weather(city='Nowhere')]"
    return ScriptedSampler(reply)


def test_single_turn_categories_end_to_end():
    cats = "normal_atom_bool,normal_single_turn_parallel_function,normal_multi_turn_user_adjust,normal_preference,special"
    everything = {"normal_atom_bool_0", "normal_atom_bool_1", "normal_single_turn_parallel_function_0",
                  "normal_multi_turn_user_adjust_0_0", "normal_multi_turn_user_adjust_0_1",
                  "normal_multi_turn_user_adjust_1_0", "normal_preference_0", "special_incomplete_0",
                  "special_error_param_0", "special_irrelevant_0"}
    sampler = single_turn_oracle(everything)
    metrics, records = A.run_acebench(sampler, data_dir=DATA, sampling=SAMPLING, categories=cats)
    assert all(r["score"] == 1.0 for r in records) and len(records) == 10
    assert metrics["acebench/special"] == 1.0 and "acebench/normal" not in metrics and "acebench/overall" not in metrics
    assert {c["temperature"] for c in sampler.calls} == {0.0}  # the suite's sampling, not the agent roles'
    # half wrong: atom_bool 1/2; the first conversation loses its second turn -> 1/2 whole, process 3/4
    half = everything - {"normal_atom_bool_1", "normal_multi_turn_user_adjust_0_1", "special_irrelevant_0"}
    metrics, _ = A.run_acebench(single_turn_oracle(half), data_dir=DATA, sampling=SAMPLING, categories=cats)
    assert metrics["acebench/normal_atom_bool"] == 0.5
    assert metrics["acebench/normal_multi_turn_user_adjust"] == 0.5
    assert metrics["acebench/normal_multi_turn_user_adjust_process"] == 0.75
    assert metrics["acebench/special"] == pytest.approx(2 / 3)
    assert metrics["acebench/items"] == 10


def test_prompts_carry_specs_time_profile_and_the_special_phrases():
    rows = {c: A.load_category(DATA, c) for c in ("normal_atom_bool", "normal_preference", "special_incomplete")}
    system, user = A.single_turn_messages(rows["normal_atom_bool"][1], "normal_atom_bool")
    assert "2024-06-01" in system["content"] and "'name': 'get_weather'" in system["content"]
    assert user["content"] == "Conversation history 1..t:\nuser: Weather in Paris for 3 days?\n"
    assert "'home': 'Lisbon'" in A.single_turn_messages(rows["normal_preference"][0], "normal_preference")[0]["content"]
    special = A.single_turn_messages(rows["special_incomplete"][0], "special_incomplete")[0]["content"]
    for phrase in ("Missing necessary parameters (key1, key2, ...) for the api (ApiName)",
                   "There is incorrect value (value) for the parameters (key)", "Due to the limitations of the function"):
        assert phrase in special


def step_oracle(stones, seen):
    """Multi-step agent: replays the milestones one per execution result, then finishes."""
    def reply(messages, k):
        seen.append(messages[1]["content"])
        done = messages[1]["content"].count("execution result:")
        return stones[done] if done < len(stones) else "finish conversation"
    return ScriptedSampler(reply)


def test_agent_multi_step_engine():
    entry = A.load_category(DATA, "agent_multi_step")[0]
    stones = entry["answer"]["mile_stone"]
    seen = []
    metrics, records = A.run_acebench(step_oracle(stones, seen), data_dir=DATA, sampling=SAMPLING,
                                      categories="agent_multi_step", repo=str(REPO))
    assert metrics["acebench/agent_multi_step"] == 1.0 and metrics["acebench/agent_multi_step_process"] == 1.0
    assert records[0]["final_state"] == entry["answer"]["ground_truth"] and records[0]["milestones"] == stones
    # ACEBench's scene: the agent reads the instruction and the execution results, not its own calls
    assert seen[1].endswith("user:I am Eve. Text Frank 'lunch?'.\nexecution result:[{'status': True, 'message': "
                            "'Wi-Fi is on'}]\n") and "agent:" not in seen[-1]
    # sending before Wi-Fi: the message is refused, the state is wrong, and the scan finds no milestone
    metrics, records = A.run_acebench(step_oracle(stones[::-1], []), data_dir=DATA, sampling=SAMPLING,
                                      categories="agent_multi_step", repo=str(REPO))
    assert (metrics["acebench/agent_multi_step"], records[0]["error"]) == (0.0, "MessageApi.inbox differs")
    assert metrics["acebench/agent_multi_step_process"] == 0.5  # turn_on_wifi found, send_message after it not
    # an unknown user makes the call fail, and the model reads why; prose is answered with a nudge
    bad = ["[turn_on_wifi()]", "I will now send it.", "[send_message(sender_name='Bob', receiver_name='Frank', message='x')]"]
    _, records = A.run_acebench(step_oracle(bad, []), data_dir=DATA, sampling=SAMPLING,
                                categories="agent_multi_step", repo=str(REPO))
    replies = [d["message"] for d in records[0]["dialogue"] if d["sender"] == "execution"]
    assert replies[1] == A.NOT_A_CALL and replies[2] == ["Error during execution: 'Bob'"]
    assert records[0]["final_state"][0] == {"BaseApi": {"wifi": True, "logged_in": True}}


def test_agent_multi_step_chinese_prompt_as_the_authors_route_sends_it():
    """--acebench_multi_step_language zh: the multi-step agent's system and user messages are the
    Chinese ones (the authors' API route), with the same call format, the 'finish conversation'
    phrase and the three roles; the scene and the score are unchanged."""
    entry = A.load_category(DATA, "agent_multi_step")[0]
    stones, seen = entry["answer"]["mile_stone"], []
    oracle = step_oracle(stones, seen)
    systems = []
    chat = oracle.chat
    oracle.chat = lambda convs, **kw: systems.extend(c[0]["content"] for c in convs) or chat(convs, **kw)
    cfg = E.EvalConfig(data_dir=str(FIXTURES), acebench_repo=str(REPO), acebench_categories="agent_multi_step",
                       acebench_multi_step_language="zh")
    metrics, _ = E.run_suite("acebench", oracle, cfg)
    assert metrics["acebench/agent_multi_step"] == 1.0 and set(systems) == {A.MULTI_STEP_PROMPT_ZH}
    for must in ("[ApiName(key1='value1', key2='value2', ...)]", "finish conversation", "user：",
                 "agent：", "execution：", "一次只调用一个函数"):
        assert must in A.MULTI_STEP_PROMPT_ZH, must
    assert seen[0].startswith("你可以调用的API（JSON格式）：") and "到目前为止的对话：\nuser:I am Eve." in seen[0]
    assert E.EvalConfig().acebench_multi_step_language == "en"  # the English split's language


def multi_turn_agent(messages, k):
    history = messages[1]["content"]
    last = history.strip().splitlines()[-1]
    if last.startswith("user:") and "lunch" in last:
        return "[turn_on_wifi()]"
    if last.startswith("execution:") and "Wi-Fi" in last:
        return "[send_message(sender_name='Eve', receiver_name='Frank', message='lunch?')]"
    return "Your message is sent. Anything else?"


def test_agent_multi_turn_with_a_scripted_user():
    turns = []

    def user(messages, k):
        turns.append(messages)
        return "Please text Frank 'lunch?' from Eve." if len(messages) == 2 else "finish conversation"

    metrics, records = A.run_acebench(ScriptedSampler(multi_turn_agent), data_dir=DATA, sampling=SAMPLING,
                                      categories="agent_multi_turn", repo=str(REPO), user=ScriptedSampler(user))
    assert metrics["acebench/agent_multi_turn"] == 1.0 and metrics["acebench/agent_multi_turn_process"] == 1.0
    route = [(d["sender"], d["recipient"]) for d in records[0]["dialogue"]]
    assert route == [("user", "agent"), ("agent", "execution"), ("execution", "agent"), ("agent", "execution"),
                     ("execution", "agent"), ("agent", "user"), ("user", "agent")]
    assert "Ask the agent to text Frank" in turns[0][0]["content"] and turns[0][1]["role"] == "user"
    assert [m["role"] for m in turns[1]] == ["system", "user", "assistant", "user"]
    assert turns[1][-1]["content"] == "Your message is sent. Anything else?"


def test_agent_multi_turn_user_on_an_openai_endpoint(tmp_path, openai_endpoint):
    """eval.py --suites acebench --acebench_user_endpoint URL: the user simulator is served over HTTP."""
    def user(body):
        text = "Text Frank 'lunch?' for me, I am Eve." if len(body["messages"]) == 2 else "finish conversation"
        return {"choices": [{"index": 0, "message": {"role": "assistant", "content": text}}]}

    url, seen = openai_endpoint(user)
    cfg = E.EvalConfig(suites="acebench", acebench_categories="agent", data_dir=str(FIXTURES), output_dir=str(tmp_path),
                       acebench_repo=str(REPO), acebench_user_endpoint=url, acebench_user_model="usersim")
    agent = ScriptedSampler(lambda m, k: step_oracle(["[turn_on_wifi()]", "[send_message(sender_name='Eve', "
                                                      "receiver_name='Frank', message='lunch?')]"], []).fn(m, k)
                            if "execution result" in m[1]["content"] or m[1]["content"].endswith("lunch?'.\n")
                            else multi_turn_agent(m, k))
    results = E.evaluate(cfg, sampler=agent)
    assert results["metrics"]["acebench/agent"] == 1.0 and results["metrics"]["acebench/items"] == 2
    assert {b["model"] for b in seen} == {"usersim"} and seen[0]["temperature"] == 0.001
    assert results["sampling"]["acebench"] == {"n": 1, "temperature": 0.7, "top_p": 1.0, "top_k": -1,
                                               "max_new_tokens": 16384, "seed": 0}
    lines = (tmp_path / "samples" / "acebench.jsonl").read_text().splitlines()
    assert [json.loads(line)["category"] for line in lines] == ["agent_multi_step", "agent_multi_turn"]


def test_missing_parts_say_what_to_provide(tmp_path):
    nothing = ScriptedSampler(lambda m, k: "")
    with pytest.raises(A.MissingDataset, match=re.escape("data_all/data_en")):
        E.evaluate(E.EvalConfig(suites="acebench", acebench_categories="normal", data_dir=str(tmp_path),
                                output_dir=str(tmp_path)), sampler=nothing)
    with pytest.raises(A.MissingDataset, match="--acebench_repo"):
        A.run_acebench(nothing, data_dir=DATA, sampling=SAMPLING, categories="agent_multi_step")
    with pytest.raises(A.MissingDataset, match="--acebench_user_endpoint"):
        A.run_acebench(nothing, data_dir=DATA, sampling=SAMPLING, categories="agent", repo=str(REPO))
    with pytest.raises(ValueError, match="unknown ACEBench category"):
        A.expand_categories("normal,agent_multi_hop")
    assert A.expand_categories("test_all") == [c for g in A.CATEGORIES.values() for c in g]
    assert nothing.calls == []  # nothing was sampled before the failure
