"""ACEBench (github.com/ACEBench/ACEBench, English split), reimplemented from its public harness
for SPADE's tool-use result (arXiv 2608.19197, Sec. 5: up to +13.9 on ACEBench-Agent). eval.py
runs it as the suite `acebench`; this module holds its prompts, decoder, checkers, scenario engine
and score.

The model is prompted in ACEBench's prompt mode: the API specifications sit in the system prompt and
the model answers with a Python-style list of calls, `[ApiName(key1='value1', ...)]`, decoded by
`ast` (never executed). Categories and scores:
    Normal  (12): single_turn_single_function, single_turn_parallel_function,
                  multi_turn_user_adjust, multi_turn_user_switch, similar_api, preference,
                  atom_{bool,enum,number,list,object_deep,object_short}. A reply is right when
                  ACEBench's checker accepts its calls against one of the possible answers
                  (function names and counts, required and extra parameters, types, then values:
                  strings standardized and matched as a substring, lists exactly, dicts key by
                  key). A multi-turn conversation is right when every one of its turns is.
    Special  (3): incomplete, error_param, irrelevant; right when the reply carries ACEBench's
                  phrase ("Missing necessary parameters" + the API and parameter names; "There is
                  incorrect value" + the wrong values; "the limitations of the function").
    Agent    (2): multi_turn (a user simulator on an OpenAI-compatible endpoint talks to the model,
                  which calls stateful APIs) and multi_step (the model alone, from one instruction);
                  right when the API classes' final state equals the expected one (end to end);
                  process = share of the milestone calls made in order (max over alternatives).
    normal = mean of the 12, special = mean of the 3, agent = mean of the 2 end-to-end accuracies
    overall = 0.578 normal + 0.2676 special + 0.1545 agent                 (ACEBench's summary)

Data (`<data_dir>/acebench/`, a copy of the repository's `data_all/data_en/`; JSON lines):
    data_<category>.json                  {"id", "question", "function": [API specs], "time"?,
                                           "profile"?, agent: "initial_config", "involved_classes"}
    possible_answer/data_<category>.json  {"id", "ground_truth", agent: "mile_stone"}
The Agent categories also need the repository itself (`--acebench_repo DIR`): its stateful API
classes (model_inference/multi_turn/scenariosen/: BaseApi, MessageApi, ReminderApi, FoodPlatform,
Travel) are loaded from there, not reimplemented; without it the suite stops and says so.

ACEBench's quirks are kept, since its scores are what the paper reports: top-level numbers and
booleans are type-checked only; strings lose their whitespace before decoding; an expected API
class absent from the final state is not checked; the milestone scan does not back up past a
milestone it cannot find; the multi-step agent reads the instruction and the execution results,
not its own calls.
Departures from ACEBench's harness:
1. Prompts are written in our words; the output format and the phrases the checkers look for are
   ACEBench's. Reasoning before the last `</think>` is dropped (as the authors' patch does).
2. Agent calls are run by name on the API instances with the decoded literal arguments (ACEBench
   `eval`s a rebuilt call string); a call that fails gives "Error during execution: ..." and the
   turn's later calls still run, in both agent categories (ACEBench's multi-turn stops the turn and
   shows the model its error template unfilled; as there, the final state counts only once some
   turn ran all its calls).
3. The user simulator's own turns are sent back to it as `assistant` messages (ACEBench: `system`,
   which many local chat templates refuse after the first message).
4. The multi-step agent's prompt is in English by default, as ACEBench's local-model route sends it
   with the English split; its API-model route, which the authors' run takes, builds that agent
   without the run's language and so sends ACEBench's Chinese prompt (its other roles stay English):
   --acebench_multi_step_language zh sends MULTI_STEP_PROMPT_ZH, the same content in our words.
Agreement with ACEBench's own harness on its data: `python bench/acebench_upstream.py ACEBENCH_DIR`.
Sampling as the authors' run: single-turn T 0.7, top-p 1, 16,384 tokens; the agent and the user
simulator at ACEBench's role defaults (T 0.001, top-p 1, 1,000 tokens), at most 40 messages.

Dependencies: stdlib, tqdm. Test: `pytest tests/test_acebench.py`.
"""
from __future__ import annotations

import ast
import copy
import importlib
import inspect
import json
import re
import sys
from collections import Counter
from pathlib import Path

from tqdm import tqdm

from agent import after_thinking
from suites import MissingDataset

CATEGORIES = {
    "normal": ("normal_single_turn_single_function", "normal_single_turn_parallel_function",
               "normal_multi_turn_user_adjust", "normal_multi_turn_user_switch",
               "normal_similar_api", "normal_preference", "normal_atom_bool", "normal_atom_enum",
               "normal_atom_number", "normal_atom_list", "normal_atom_object_deep",
               "normal_atom_object_short"),
    "special": ("special_incomplete", "special_error_param", "special_irrelevant"),
    "agent": ("agent_multi_step", "agent_multi_turn"),
}
SUMMARY_WEIGHTS = {"normal": 0.578, "special": 0.2676, "agent": 0.1545}  # ACEBench's summary
# ACEBench's agent/user sampling defaults
ROLE_SAMPLING = {"temperature": 0.001, "top_p": 1.0, "max_new_tokens": 1000}
MAX_MESSAGES = 40
# The state of each API class compared after an agent scenario (ACEBench's saved attributes).
SAVED_STATE = {"BaseApi": ("wifi", "logged_in"), "MessageApi": ("inbox",),
               "ReminderApi": ("reminder_list",),
               "FoodPlatform": ("users", "logged_in_users", "orders"),
               "Travel": ("users", "reservations")}
CLASS_MODULES = {"BaseApi": "phone_platform.base_api", "MessageApi": "phone_platform.message",
                 "ReminderApi": "phone_platform.reminder",
                 "FoodPlatform": "phone_platform.food_services", "Travel": "travel"}
CLASS_PACKAGE = "model_inference.multi_turn.scenariosen"


def expand_categories(spec: str) -> list[str]:
    """`test_all`, group names (normal, special, agent) or category names, comma-separated."""
    out = []
    for name in [s.strip() for s in spec.split(",") if s.strip()]:
        names = ([c for g in CATEGORIES.values() for c in g] if name == "test_all"
                 else CATEGORIES.get(name, (name,)))
        for cat in names:
            if not any(cat in g for g in CATEGORIES.values()):
                raise ValueError(f"unknown ACEBench category {cat!r}")
            out += [cat] if cat not in out else []
    return out


def _read_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()
            if line.strip()]


def load_category(data_dir, category: str, limit: int | None = None) -> list[dict]:
    """Entries of one category, each with its "answer" row (paired by id)."""
    data = Path(data_dir) / f"data_{category}.json"
    answers = Path(data_dir) / "possible_answer" / f"data_{category}.json"
    for path in (data, answers):
        if not path.exists():
            raise MissingDataset(
                f"acebench: no {path}. Copy ACEBench's English data there: `git clone "
                f"https://github.com/ACEBench/ACEBench && cp -r ACEBench/data_all/data_en "
                f"{Path(data_dir)}` (the files data_<category>.json and possible_answer/; formats "
                "in acebench.py's docstring)")
    truth = {row["id"]: row for row in _read_lines(answers)}
    return [{**e, "answer": truth[e["id"]]} for e in _read_lines(data)[:limit]]


# ----------------------------------------------------------------------------------------------
# prompts (ours in wording; the call format and the special phrases are ACEBench's)

ROLES = (
    "Roles:\n"
    "user: the user\n"
    "assistant: the AI assistant, who makes the API calls\n"
    "tool: returns what the calls produced")
CALL_FORMAT = (
    "Write the calls as one Python-style list, [ApiName(key1='value1', key2='value2', ...)], "
    "with the real API name, parameter names and values; the reply starts with \"[\" and ends "
    "with \"]\". Separate several calls with commas: [ApiName(key1='value1', ...), "
    "ApiName(key1='value1', ...)].")
NORMAL_PROMPT = (
    "You are the assistant in a conversation with a user, and you act by calling APIs. From the "
    "API specifications and the conversation so far (turns 1..t), write the API calls the "
    "assistant makes at turn t+1.\n"
    + CALL_FORMAT + " Write nothing else: no explanation, no hint, no call results.\n"
    "A parameter is optional unless its description says otherwise: include the parameters the "
    "{source} mentions and leave out the others.\n"
    "When a description prescribes no format for a value, copy the {source}'s own wording.\n"
    "An API without parameters is called as [ApiName()]; never invent parameter names.\n\n"
    "{context}\n\n"
    + ROLES + "\n\n"
    "API specifications:\n"
    "{functions}")
SPECIAL_PROMPT = (
    "You are the assistant in a conversation with a user, and you act by calling APIs. From the "
    "API specifications and the conversation so far (turns 1..t), write the assistant's output "
    "at turn t+1. Two cases:\n"
    "1. The request is clear and complete, and the candidate APIs can serve it: copy the user's "
    "wording for any value whose format the description does not prescribe, call every API the "
    "request needs, and output only the calls. " + CALL_FORMAT + "\n"
    "2. The request is unclear, incomplete or wrong, or beyond the APIs: say so, in exactly one "
    "of these forms.\n"
    "   (1) A value the user gave does not fit the type or form the API defines: [\"There is "
    "incorrect value (value) for the parameters (key) in the conversation history.\"]\n"
    "   (2) The user left out values the API requires: [\"Missing necessary parameters (key1, "
    "key2, ...) for the api (ApiName)\"], naming the missing parameters and the API.\n"
    "   (3) No API can do what is asked: [\"Due to the limitations of the function, I cannot "
    "solve this problem.\"]\n"
    "   Check them in this order: decide first whether (1) applies, and keep (1) and (2) "
    "apart.\n\n"
    "{context}\n\n"
    + ROLES + "\n\n"
    "API specifications:\n"
    "{functions}")
HISTORY_PROMPT = "Conversation history 1..t:\n{question}"


def single_turn_messages(entry: dict, category: str) -> list[dict]:
    """System prompt (API specs, time or profile) and the conversation so far, as ACEBench
    sends them."""
    functions = entry["function"] if isinstance(entry["function"], list) else [entry["function"]]
    if category.startswith("special"):
        system = SPECIAL_PROMPT.format(context=entry.get("time", ""), functions=functions)
    elif category == "normal_preference":
        profile = "User profile:\n" + str(entry.get("profile", ""))
        system = NORMAL_PROMPT.format(source="user or the profile", context=profile,
                                      functions=functions)
    else:
        system = NORMAL_PROMPT.format(source="user", context=entry.get("time", ""),
                                      functions=functions)
    history = HISTORY_PROMPT.format(question=entry["question"])
    return [{"role": "system", "content": system}, {"role": "user", "content": history}]


# ----------------------------------------------------------------------------------------------
# decoding the call list. Only literals are read; nothing is evaluated.

_ARITH = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
          ast.Div: lambda a, b: a / b}


def _value(node):
    """A call argument as ACEBench reads it: literals, names as their text, nested calls
    as dicts."""
    if isinstance(node, ast.Constant):
        return "..." if node.value is Ellipsis else node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_value(node.operand)
    if isinstance(node, (ast.List, ast.Tuple)):
        items = [_value(v) for v in node.elts]
        return items if isinstance(node, ast.List) else tuple(items)
    if isinstance(node, ast.Dict):
        return {_value(k): _value(v) for k, v in zip(node.keys, node.values)}
    if isinstance(node, ast.Name):
        return node.id
    # arithmetic on numbers, joined strings
    if isinstance(node, ast.BinOp) and type(node.op) in _ARITH:
        a, b = _value(node.left), _value(node.right)
        numbers = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (a, b))
        if numbers or (isinstance(node.op, ast.Add) and isinstance(a, str) and isinstance(b, str)):
            return _ARITH[type(node.op)](a, b)
    if isinstance(node, ast.Call):
        return _call(node)
    if isinstance(node, ast.Subscript):
        return ast.unparse(node)
    raise ValueError(f"unsupported argument {ast.unparse(node)!r}")


def _call(node: ast.Call) -> dict:
    name = ast.unparse(node.func)
    return {name: {kw.arg: _value(kw.value) for kw in node.keywords}}


def decode_calls(reply: str) -> list[dict]:
    """ACEBench's single-turn decoder: whitespace removed, then a list (or tuple) of calls, each
    `{name: {param: value}}`; anything else raises ValueError."""
    text = "".join(after_thinking(reply).split())
    try:
        body = ast.parse(text, mode="eval").body
    except SyntaxError as err:
        raise ValueError(f"not a call list: {err}") from err
    is_list = isinstance(body, (ast.List, ast.Tuple))
    if not is_list or not all(isinstance(e, ast.Call) for e in body.elts):
        raise ValueError("not a list of calls")
    return [_call(e) for e in body.elts]


def decode_agent_calls(reply: str, strict: bool = True) -> list[dict]:
    """ACEBench's agent-side decoder: brackets added where missing and stripped again, then one call
    or a list/tuple of calls (strict: a non-call element is an error; else it is skipped)."""
    text = reply[1:] if reply.startswith(" ") else reply
    opening = "[" if not text.startswith("[") else ""
    closing = "]" if not text.endswith("]") else ""
    text = opening + text + closing
    try:
        body = ast.parse(text.strip("[]'"), mode="eval").body
    except SyntaxError as err:
        raise ValueError(f"not a call: {err}") from err
    if isinstance(body, ast.Call):
        return [_call(body)]
    if not isinstance(body, (ast.Tuple, ast.List)):
        return []
    if strict and not all(isinstance(e, ast.Call) for e in body.elts):
        raise ValueError("a list element is not a call")
    return [_call(e) for e in body.elts if isinstance(e, ast.Call)]


# ----------------------------------------------------------------------------------------------
# the Normal checker (ACEBench's rules, its quirks included)

TYPES = {"string": str, "integer": int, "float": float, "boolean": bool, "array": list,
         "tuple": list, "dict": dict, "any": str, "list": list, "object": dict,
         "objectArray": list, "list(string)": list, "list(enum)": list, "int": int,
         "enum": enumerate, "number": int}
NESTED = ("array", "tuple", "list(string)", "list(enum)", "object", "objectArray")


def standardize(text: str) -> str:
    return re.sub(r"[ ,./\-_*^]", "", text).lower().replace("'", '"')


def _bool_text(value):
    return {"true": True, "false": False}.get(value, value) if isinstance(value, str) else value


def _type_ok(value, expected, want, nested) -> tuple[bool, bool]:
    """(valid, is_variable). is_variable: the answer's type differs from the schema's, so the value
    itself is not compared (ACEBench's rule); nested types are checked element-wise."""
    variable = expected != "" and type(expected) is not want
    value = _bool_text(value)
    if type(value) is want:
        if nested is None:
            return True, variable
        for item in expected:
            if not isinstance(item, list) or all(_type_ok(v, item, nested, None)[0] for v in value):
                return True, variable
        return False, variable
    if expected != "" and (type(value) is type(expected) or value == expected):
        return True, True
    return False, variable


def _dict_ok(value, expected) -> bool:
    if not isinstance(value, dict) or len(value) != len(expected):
        return False
    for key, v in value.items():
        v = _bool_text(v)
        if key not in expected:
            return False
        want = expected[key]
        if isinstance(want, dict):
            if not _dict_ok(v, want):
                return False
            continue
        got = standardize(v) if isinstance(v, str) else v
        want = standardize(want) if isinstance(want, str) else want
        if str(want) not in str(got):
            return False
    return True


def _std_list(values) -> list:
    return [standardize(v) if isinstance(v, str) else v for v in values]


def _param_error(param, value, expected, spec, category) -> str | None:
    kind = spec.get("type")
    if kind not in TYPES:
        return f"unknown type {kind!r} of {param}"
    want, nested = TYPES[kind], None
    if kind in NESTED:
        default = "string" if "string" in kind else "enum" if "enum" in kind else "dict"
        inner = spec.get("items", {}).get("type") or default
        nested = TYPES.get(inner, dict)
    if kind == "tuple" and isinstance(value, tuple):
        value = list(value)
    if kind == "float" and type(value) is int:
        value = float(value)
    valid, variable = _type_ok(value, expected, want, nested)
    if not valid:
        return f"type_error: {param}"
    if variable:
        return None
    if want is dict:
        return None if _dict_ok(value, expected) else f"value_error: {param}"
    if want is list and nested is dict:
        ok = (isinstance(expected, list) and len(value) == len(expected)
              and all(map(_dict_ok, value, expected)))
        return None if ok else f"value_error: {param}"
    if want is str:
        got, gold = standardize(value), standardize(expected)
        same = got == gold if "agent" in category else gold in got
        return None if same else f"value_error: {param}"
    if want is list:
        return None if _std_list(value) == _std_list(expected) else f"value_error: {param}"
    return None  # numbers and booleans: the type check is the whole check


def _call_error(spec: dict | None, call: dict, expected: dict, category: str) -> str | None:
    """Why one decoded call does not match one expected call (None: it matches)."""
    (name, params), = call.items()
    gold = next(iter(expected.values()))
    schema = None if spec is None else spec.get("parameters", {})
    if spec is None:
        return f"no specification for {name}"
    if params == {} or schema == {}:
        return None if params == schema else "wrong_param"
    if gold == schema.get("properties"):
        return None
    if gold == {}:
        return "wrong_param"
    if spec["name"] not in call:
        return f"wrong_function_name: {name}"
    props = schema.get("properties", {})
    missing = [p for p in schema.get("required", []) if p not in params]
    if missing:
        return f"lack_args: {missing[0]}"
    for param, value in params.items():
        if param not in props or param not in gold:
            return f"addition_args: {param}"
        error = _param_error(param, value, gold[param], props[param], category)
        if error:
            return error
    return None


def normal_error(functions: list[dict], calls: list[dict], answer: dict,
                 category: str) -> str | None:
    """Why the calls fail one possible answer (None: accepted). Answer keys may carry a `_<n>`
    suffix when one function is called more than once."""
    if len(calls) != len(answer):
        return "wrong number of functions"
    expected = [(re.sub(r"_\d+$", "", key), key, args) for key, args in answer.items()]
    if Counter(next(iter(c)) for c in calls) != Counter(name for name, _, _ in expected):
        return "function_mismatch"
    for name, key, args in expected:
        # ACEBench: the first name inside the key
        spec = next((f for f in functions if f["name"] in key), None)
        errors = [_call_error(spec, c, {name: args}, category) for c in calls
                  if next(iter(c)) == name]
        if None not in errors:
            return errors[-1]
    return None


def score_normal(entry: dict, reply: str, category: str) -> tuple[bool, str | None]:
    try:
        calls = decode_calls(reply)
    except (ValueError, TypeError, RecursionError) as err:
        return False, f"wrong_output_format: {err}"
    answers = entry["answer"]["ground_truth"]
    errors = []
    for answer in answers if isinstance(answers, list) else [answers]:
        try:
            errors.append(normal_error(entry["function"], calls, answer, category))
        except (TypeError, ValueError, AttributeError, KeyError) as err:
            errors.append(f"checker_error: {err!r}")  # a shape the rules do not expect
    return None in errors, None if None in errors else errors[0]


def score_special(entry: dict, reply: str, category: str) -> tuple[bool, str | None]:
    """ACEBench's phrase checks on the reply text."""
    text, truth = after_thinking(reply).strip(), entry["answer"]["ground_truth"]
    if category == "special_irrelevant":
        ok = "the limitations of the function" in text
        return ok, None if ok else "error_detection"
    phrase = ("Missing necessary parameters" if category == "special_incomplete"
              else "There is incorrect value")
    if phrase not in text:
        return False, "error_detection"
    for name, values in truth.items():
        unnamed = category == "special_incomplete" and name not in text
        if unnamed or any(v not in text for v in values):
            return False, "error_correction"
    return True, None


def conversation_accuracy(ids: list[str], valid: list[bool]) -> tuple[float, float]:
    """Normal multi-turn: ids `<category>_<conversation>_<turn>`; (share of conversations with every
    turn right, mean share of right turns per conversation)."""
    groups: dict[str, list[bool]] = {}
    for i, ok in zip(ids, valid):
        groups.setdefault(i.split("_")[-2], []).append(ok)
    if not groups:
        return 0.0, 0.0
    whole = sum(all(g) for g in groups.values()) / len(groups)
    turns = sum(sum(g) / len(g) for g in groups.values()) / len(groups)
    return whole, turns


# ----------------------------------------------------------------------------------------------
# the Agent categories. A scenario holds the API instances (ACEBench's own classes, loaded
# from its repository), the dialogue, and the milestones (every call message the agent sent).

PHONE_POLICY = (
    "It is June 11, 2024, 16:00 (Beijing time). You are a simulated phone assistant: you can "
    "send and read text messages, add and read reminders, and order food delivery.\n"
    "Give no information, knowledge or procedure that neither the user nor a tool provided, and "
    "no personal opinions. Call one tool at a time (parallel calls of the same tool are "
    "allowed); never talk to the user and call a tool in the same reply. Refuse requests that "
    "break these rules. When the user's information is incomplete or a call returns an error, "
    "ask the user for what is missing. Names the user gives are full names.\n"
    "Sending a message: first find out who sends it and who receives it. If the inbox is full "
    "and a message must be deleted, ask the user: \"Memory is full, which message would you like "
    "to delete?\"\n"
    "Reading messages: first log in to the device with login_device(), and find out the sender "
    "and the receiver. Afterwards ask whether the user wants the content added to a reminder, "
    "and whether they want to reply; if the message is about food delivery, ask whether to order "
    "it.\n"
    "Adding a reminder: get its title and content first; its time defaults to now. If the "
    "reminder is the content of a message, read that message first.\n"
    "Reading a reminder by title: afterwards ask whether the user wants to complete its tasks.\n"
    "Ordering food: get the user's delivery-platform account and password and log in with "
    "login_food_platform(). Ask for the merchant, products and quantities if they were not "
    "given. Orders from different merchants are placed one at a time. If the balance is too low, "
    "tell the user \"Insufficient balance\" and ask whether to change the order.\n"
    "Calls must follow the format [ApiName(key1='value1', key2='value2', ...)], starting with [ "
    "and ending with ]. Keep the user informed of progress and do not repeat a call. When you "
    "judge the task complete, reply \"finish conversation\" to end the dialogue.")
TRAVEL_POLICY = (
    "It is July 15, 2024, 08:00 (Beijing time). You are an airline agent: you help users book, "
    "change and cancel flight reservations.\n"
    "Before any call that changes the reservation database (booking, changing flights, baggage, "
    "cabin or passenger details), list what you will do and get the user's explicit \"Yes\"; one "
    "confirmation per kind of change is enough. Give no information, knowledge or procedure that "
    "neither the user nor a tool provided, and no personal opinions. Call one tool at a time "
    "(parallel calls of the same tool are allowed); never talk to the user and call a tool in "
    "the same reply. Refuse requests that break these rules; transfer the user to a human agent "
    "only when the request is outside what you can do.\n"
    "Domain: a user has an id, payment methods, reservations and a membership level; a "
    "reservation has an id, user id, flight, payment method, baggage and cabin; a flight has a "
    "number, origin, destination, scheduled local departure and arrival times and remaining "
    "seats.\n"
    "Booking: get the user id and password first, then origin and destination; usually search "
    "flights before booking. A round trip is two bookings, out and back. With no suitable direct "
    "flight, consider a connection through a layover city and book both legs (a parallel call is "
    "allowed here: [ApiName(key1='value1', ...), ApiName(key1='value1', ...)]). Payment is cash "
    "or bank: ask which. Free checked bags: regular members 1 in economy and 2 in business; "
    "silver members 2 in economy and 3 in business; gold members 3 in either; each extra bag "
    "costs 50 yuan.\n"
    "Changing: get the user id and password first; reservations can be found by user id. A "
    "flight may be changed as long as origin and destination stay the same; kept segments keep "
    "their old price; the API does not check these rules, so you must. Any reservation may "
    "change cabin without changing flights, paying the difference; all segments of a reservation "
    "share one cabin. Checked bags can be added, never removed. When a flight changes, ask how "
    "to pay or be refunded.\n"
    "Cancelling: get the user id, reservation id and reason (change of plans, airline cancelled "
    "the flight, or other). Any reservation can be cancelled within 24 hours of booking or when "
    "the airline cancelled the flight; otherwise cancelling economy costs a 20% fee, while "
    "business can always be cancelled; membership does not change this. Only whole itineraries "
    "with no flown segment can be cancelled; otherwise transfer the user to a human agent. "
    "Refunds go to the user's account automatically.\n"
    "Compensation: silver or gold members, or business travellers, who complain about a "
    "cancelled flight may get a 200-yuan voucher per passenger after checking; about a delayed "
    "flight, when they also change or cancel the reservation, 100 yuan per passenger after the "
    "change or cancellation. Offer compensation only when the user complains and asks for it.\n"
    "Calls must follow the format [ApiName(key1='value1', key2='value2', ...)]. When you judge "
    "the task complete, reply \"finish conversation\" to end the dialogue.")
MULTI_TURN_PROMPT = (
    "You are an AI system talking with a user and calling APIs. From the API specifications and "
    "the dialogue so far (steps 1..t), write your message for step t+1.\n"
    "1. If you have everything a call needs, output only the call(s), as [ApiName(key1='value1', "
    "key2='value2', ...)], and nothing else. A parameter is optional unless its description says "
    "otherwise (include what the user mentioned, leave out the rest); when no format is "
    "prescribed for a value, copy the user's wording.\n"
    "2. If information is missing, ask the user for it; never answer on the user's behalf.\n\n"
    "Roles:\n"
    "user: the user\n"
    "agent: you, the AI system that calls APIs\n"
    "execution: runs your calls and returns their results\n\n"
    "Rules you must follow:\n")
MULTI_STEP_PROMPT = (
    "You are an AI system that solves a task by calling APIs. From the API specifications and "
    "the dialogue so far (steps 1..t), write your message for step t+1.\n"
    + CALL_FORMAT + " Output nothing else with calls.\n"
    "A parameter is optional unless its description says otherwise (include what the user "
    "mentioned, leave out the rest); when no format is prescribed for a value, copy the user's "
    "wording.\n"
    "When the task takes several steps that depend on each other, take them one at a time and "
    "decide each next step from what the execution returned. Call one function at a time as a "
    "rule.\n"
    "When you judge the task complete, reply \"finish conversation\" to end the dialogue.\n\n"
    "Roles:\n"
    "user: the user\n"
    "agent: you, the AI system that calls APIs\n"
    "execution: runs your calls and returns their results\n")
# --acebench_multi_step_language zh: what the authors' route sends (ACEBench's API-model agent for
# multi_step is built without the run's language and so speaks Chinese), in our words.
MULTI_STEP_PROMPT_ZH = (
    "你是一个通过调用API来完成任务的AI系统。请依据API说明和到目前为止的对话（第1..t步），"
    "写出第t+1步的消息。\n"
    "需要调用API时，把调用写成一个Python风格的列表：[ApiName(key1='value1', key2='value2', "
    "...)]，其中ApiName、参数名和参数值都换成真实的内容；回复以“[”开头、以“]”结尾，"
    "多个调用之间用英文逗号隔开，例如 [ApiName(key1='value1', ...), ApiName(key1='value1', "
    "...)]。输出调用时不要再写任何解释、提示或调用结果。\n"
    "除非参数说明另有规定，参数都是可选的：用户提到的参数要写上，没提到的不写；"
    "说明里没有规定取值格式时，直接沿用用户的原话。\n"
    "任务要分几步完成、且步骤之间有先后依赖时，就一步一步来，"
    "每一步都根据execution返回的结果决定下一步。通常一次只调用一个函数，不要并行调用。\n"
    "你认为任务已经完成时，回复\"finish conversation\"来结束对话。\n\n"
    "角色：\n"
    "user：用户\n"
    "agent：你，即调用API的AI系统\n"
    "execution：执行你的调用并返回结果\n")
MULTI_STEP_USER = {"en": "The APIs you can call (JSON): {functions}. Dialogue so far:\n{history}",
                   "zh": "你可以调用的API（JSON格式）：{functions}。"
                         "到目前为止的对话：\n{history}"}
USER_RULES = {
    "Travel": "If the instruction asks for a round trip, say at the very start that you want to "
              "book a round-trip flight.",
    "phone": "Give everything the current step needs (a reminder needs its title, description "
             "and time, for example). When asked whether you need anything else, check that "
             "every task in the instruction is done; if not, ask for the next one. Names in the "
             "instruction are full names. When asked which message to delete, answer as the "
             "instruction says. Do not offer the agent help; answer its questions as the "
             "instruction allows and invent nothing you do not know.",
}
USER_PROMPT = (
    "You are a user talking with an agent.\n\n"
    "Instruction: {instruction}\n\n"
    "Rules:\n"
    "- Write one line per message, as the user would.\n"
    "- Do not reveal the whole instruction at once; give only what the current step needs.\n"
    "- Invent nothing the instruction does not give: if asked for something it does not contain "
    "(an order id, say), say you do not remember or do not have it.\n"
    "- When asked to confirm, decide from the instruction.\n"
    "- Say things in your own words rather than repeating the instruction, and keep the "
    "personality it describes.\n"
    "- {rules}\n"
    "- When the instruction's goal is reached, send a separate line 'finish conversation' to end "
    "the dialogue.")
USER_OPENING = "Hello, what can I help you with today?"
NOT_A_CALL = "Do not ask me questions; solve the task with what you know."


def api_package(repo) -> Path:
    """The checkout's directory of API classes, or a clear failure naming the flag."""
    package = Path(repo or "") / Path(*CLASS_PACKAGE.split("."))
    if not repo or not package.is_dir():
        raise MissingDataset(
            "acebench: the Agent categories run ACEBench's own API classes; pass --acebench_repo "
            "DIR, a checkout of https://github.com/ACEBench/ACEBench (needs "
            f"{Path(*CLASS_PACKAGE.split('.'))}), or leave them out with --acebench_categories "
            "normal,special")
    return package


def load_api_classes(repo, names) -> dict:
    """The named stateful API classes from a local checkout of ACEBench's repository."""
    root = str(Path(repo).resolve())
    api_package(repo)
    if root not in sys.path:
        sys.path.append(root)  # their modules import each other by package path
    return {name: getattr(importlib.import_module(f"{CLASS_PACKAGE}.{CLASS_MODULES[name]}"), name)
            for name in names}


def _jsonish(value):
    """A call's result as ACEBench passes it back: JSON-readable text is read, the rest kept
    as text."""
    if isinstance(value, dict):
        try:
            return json.loads(json.dumps(value))
        except (TypeError, ValueError):
            return str(value)
    text = value if isinstance(value, str) else str(value)
    try:
        return json.loads(text)
    except ValueError:
        return text


class Scenario:
    """One Agent item: its dialogue, the API instances it has touched, and the milestones."""

    def __init__(self, entry: dict, classes: dict, kind: str, language: str = "en"):
        self.entry, self.classes, self.kind, self.language = entry, classes, kind, language
        self.instances: dict | None = None
        self.recorded = False  # ACEBench keeps the final state once an execution turn is recorded
        self.dialogue, self.history, self.milestones, self.steps, self.done = [], "", [], 0, False
        self.user_messages: list[dict] = []

    def next_role(self) -> str:
        if self.kind == "agent_multi_step":
            agent_next = not self.steps or self.dialogue[-1]["sender"] == "execution"
            return "agent" if agent_next else "execution"
        return self.dialogue[-1]["recipient"]

    def note_last(self):
        """Append the last message to the history text the agent reads (ACEBench's scene log)."""
        last = self.dialogue[-1]
        result = last["sender"] == "execution" and self.kind == "agent_multi_step"
        label = "execution result" if result else last["sender"]
        self.history += f"{label}:{last['message']}\n"

    def add(self, sender: str, recipient: str, message):
        self.dialogue.append({"sender": sender, "recipient": recipient, "message": message})
        if self.steps > 1 and "finish conversation" in message:
            self.done = True
        self.steps += 1
        self.done = self.done or self.steps >= MAX_MESSAGES

    def execute(self, calls: list[dict]) -> list:
        """Run the calls on every involved instance that has the method (ACEBench's routing)."""
        if self.instances is None:
            self.instances, config = {}, self.entry.get("initial_config", {})
            for name in self.entry["involved_classes"]:
                api = self.classes[name]()
                api._load_scenario(copy.deepcopy(config.get(name, {})), long_context=False)
                api._load_scenario(copy.deepcopy(config.get("BaseApi", {})), long_context=False)
                self.instances[name] = api
        results = []
        for call in calls:
            (name, args), = call.items()
            methods = [m for api in self.instances.values() if not name.startswith("_")
                       for m in [getattr(api, name, None)] if inspect.ismethod(m)]
            try:
                if not methods:
                    raise AttributeError(f"no API named {name}")
                result = [m(**args) for m in methods][-1]
                results.append(_jsonish(result))
            except Exception as err:  # the model's call failed: the model reads why
                results.append(f"Error during execution: {err}")
        # multi-turn records the instances only from a turn whose calls all ran; multi-step from any
        failed = any(isinstance(r, str) and r.startswith("Error during execution") for r in results)
        self.recorded = self.recorded or self.kind == "agent_multi_step" or not failed
        return results

    def final_state(self) -> list[dict]:
        """The saved attributes of every involved class, as JSON (no call ever ran: empty)."""
        if self.instances is None or not self.recorded:
            return []
        state = [{name: {a: v for a, v in vars(api).items() if a in SAVED_STATE.get(name, ())}}
                 for name, api in self.instances.items()]
        return json.loads(json.dumps(state, default=str))


def agent_messages(sc: Scenario) -> list[dict]:
    functions = sc.entry["function"]
    if sc.kind == "agent_multi_step":
        system = MULTI_STEP_PROMPT_ZH if sc.language == "zh" else MULTI_STEP_PROMPT
        user = MULTI_STEP_USER[sc.language].format(functions=functions, history=sc.history)
        return [{"role": "system", "content": system}, {"role": "user", "content": user}]
    classes = sc.entry["involved_classes"]
    policy = ((TRAVEL_POLICY if "Travel" in classes else "")
              + (PHONE_POLICY if "BaseApi" in classes else ""))
    user = (f"The APIs you can use:\n {functions}\n\n"
            f"Dialogue so far (steps 1..t):\n{sc.history}")
    return [{"role": "system", "content": MULTI_TURN_PROMPT + policy},
            {"role": "user", "content": user}]


def _agent_turn(sc: Scenario, reply: str):
    text = after_thinking(reply).strip()
    if sc.kind == "agent_multi_step":
        return sc.add("agent", "execution", text)
    # ACEBench: a bracketed call on one line, then a clean decode
    ok = re.search(r"\[.*\]", text) is not None
    try:
        ok = ok and isinstance(decode_agent_calls(text), list)
    except (ValueError, TypeError, RecursionError):
        ok = False
    sc.add("agent", "execution" if ok else "user", text)


def _execution_turn(sc: Scenario):
    message = sc.dialogue[-1]["message"]
    sc.milestones.append(message)
    try:
        calls = decode_agent_calls(message, strict=False)
    except (ValueError, TypeError, RecursionError):
        return sc.add("execution", "agent", NOT_A_CALL)
    sc.add("execution", "agent", sc.execute(calls))


def _user_turn(sc: Scenario, reply: str):
    sc.user_messages.append({"role": "assistant", "content": reply})
    sc.add("user", "agent", reply)


def _user_prompt(entry: dict) -> list[dict]:
    rules = USER_RULES["Travel" if "Travel" in entry["involved_classes"] else "phone"]
    system = USER_PROMPT.format(instruction=entry["question"], rules=rules)
    return [{"role": "system", "content": system}, {"role": "user", "content": USER_OPENING}]


def _step_all(scenarios, role, sampler, sampling, batch_size):
    """One message for each scenario whose turn is `role`'s, sampled in chunks."""
    for i in range(0, len(scenarios), batch_size):
        chunk = scenarios[i:i + batch_size]
        if role == "user":
            for sc in chunk:
                sc.note_last()
                last = re.sub(r"^(user:|agent:)", "", str(sc.dialogue[-1]["message"]))
                sc.user_messages.append({"role": "user", "content": last})
            replies = sampler.chat([list(sc.user_messages) for sc in chunk], n=1, **sampling)
            for sc, (reply,) in zip(chunk, replies):
                _user_turn(sc, reply)
        else:
            for sc in chunk:
                sc.note_last()
            replies = sampler.chat([agent_messages(sc) for sc in chunk], n=1, **sampling)
            for sc, (reply,) in zip(chunk, replies):
                _agent_turn(sc, reply)


def play_scenarios(entries, kind, classes, *, sampler, user=None, batch_size=256,
                   sampling=ROLE_SAMPLING, language="en") -> list[Scenario]:
    """Run every Agent item of one category to its end; agent steps (and user steps) are batched.
    language: of the multi-step agent's prompt (en, or zh as the authors' route sends it)."""
    scenarios = [Scenario(e, classes, kind, language) for e in entries]
    if kind == "agent_multi_turn":  # the user simulator opens the dialogue
        openings = user.chat([_user_prompt(e) for e in entries], n=1, **sampling)
        for sc, (text,) in zip(scenarios, openings):
            sc.user_messages = _user_prompt(sc.entry) + [{"role": "assistant", "content": text}]
            sc.dialogue.append({"sender": "user", "recipient": "agent", "message": text})
    else:
        for sc in scenarios:
            sc.dialogue.append({"sender": "user", "recipient": "agent",
                                "message": sc.entry["question"]})
    with tqdm(total=len(scenarios), desc=f"acebench/{kind}", unit="item") as bar:
        while live := [sc for sc in scenarios if not sc.done]:
            for sc in [sc for sc in live if sc.next_role() == "execution"]:
                if kind == "agent_multi_turn":
                    sc.note_last()
                _execution_turn(sc)
            agents = [sc for sc in live if not sc.done and sc.next_role() == "agent"]
            _step_all(agents, "agent", sampler, sampling, batch_size)
            # (an agent's reply may have passed the turn to its user)
            users = [sc for sc in live if not sc.done and sc.next_role() == "user"]
            _step_all(users, "user", user, sampling, batch_size)
            bar.update(sum(sc.done for sc in scenarios) - bar.n)
    return scenarios


def state_error(state: list[dict], expected: list[dict]) -> str | None:
    """ACEBench's end-to-end check: the same classes, and each saved attribute equal to the expected
    one (a dict attribute: every expected key present and equal)."""
    if len(state) != len(expected):
        return "wrong number of classes"
    for want in expected:
        got = next((s for s in state if s.keys() == want.keys()), None)
        if got is None:  # ACEBench leaves an expected class that is not in the state unchecked
            continue
        (name, attrs), = got.items()
        gold = want[name]
        for attr, value in attrs.items():
            if attr not in gold:
                return f"{name}.{attr} not expected"
            target = gold[attr]
            if isinstance(target, dict):
                differs = (not isinstance(value, dict)
                           or any(k not in value or value[k] != v for k, v in target.items()))
                if differs:
                    return f"{name}.{attr} differs"
            elif value != target:
                return f"{name}.{attr} differs"
    return None


def process_accuracy(milestones: list[str], made: list[str]) -> float:
    """Share of the milestone calls found in order among the calls made (best alternative)."""
    alternatives = milestones if milestones and isinstance(milestones[0], list) else [milestones]
    best = 0.0
    for stones in alternatives:
        found, i = 0, 0
        for stone in stones:
            while i < len(made) and made[i].strip() != stone.strip():
                i += 1
            if i < len(made):
                found, i = found + 1, i + 1
        best = max(best, found / len(stones) if stones else 1.0)
    return best


# ----------------------------------------------------------------------------------------------
# the whole benchmark

def _single_turn(sampler, entries, category, sampling, batch_size):
    replies = []
    for i in tqdm(range(0, len(entries), batch_size), desc=f"acebench/{category}", unit="batch"):
        chunk = entries[i:i + batch_size]
        prompts = [single_turn_messages(e, category) for e in chunk]
        replies += [r[0] for r in sampler.chat(prompts, n=1, **sampling)]
    score = score_special if category.startswith("special") else score_normal
    results = [score(e, r, category) for e, r in zip(entries, replies)]
    records = [{"suite": "acebench", "category": category, "id": e["id"], "score": float(ok),
                "error": err, "reply": r}
               for e, r, (ok, err) in zip(entries, replies, results)]
    valid = [ok for ok, _ in results]
    if category.startswith("normal_multi_turn"):
        acc, process = conversation_accuracy([e["id"] for e in entries], valid)
        return {category: acc, f"{category}_process": process}, records
    return {category: sum(valid) / max(len(valid), 1)}, records


def _agent(sampler, user, entries, category, classes, batch_size, sampling, language):
    scenarios = play_scenarios(entries, category, classes, sampler=sampler, user=user,
                               batch_size=batch_size, sampling=sampling, language=language)
    records, wins, process = [], [], []
    for sc in scenarios:
        error = state_error(sc.final_state(), sc.entry["answer"]["ground_truth"])
        wins.append(error is None)
        process.append(1.0 if error is None
                       else process_accuracy(sc.entry["answer"]["mile_stone"], sc.milestones))
        records.append({"suite": "acebench", "category": category, "id": sc.entry["id"],
                        "score": float(error is None), "process": process[-1], "error": error,
                        "milestones": sc.milestones, "dialogue": sc.dialogue,
                        "final_state": sc.final_state()})
    n = max(len(scenarios), 1)
    return {category: sum(wins) / n, f"{category}_process": sum(process) / n}, records


def summary(scores: dict) -> dict:
    """Group scores (unweighted means of their categories) for the groups run whole, and ACEBench's
    overall score when all three are: 0.578 normal + 0.2676 special + 0.1545 agent."""
    groups = {g: sum(scores[c] for c in cs) / len(cs) for g, cs in CATEGORIES.items()
              if all(c in scores for c in cs)}
    if len(groups) == len(CATEGORIES):
        groups["overall"] = sum(SUMMARY_WEIGHTS[g] * groups[g] for g in CATEGORIES)
    return groups


def run_acebench(sampler, *, data_dir, sampling, categories="test_all", repo="", user=None,
                 batch_size=256, limit=None, agent_max_new_tokens=1000, multi_step_language="en"):
    """ACEBench's categories, its three group scores and its summary (formulas in the docstring).
    `user`: a sampler for the Agent multi-turn user simulator; multi_step_language: en or zh (the
    multi-step agent's prompt, departure 4). A group's score and the overall score are reported
    only when all their categories ran."""
    cats = expand_categories(categories)
    if any(c.startswith("agent") for c in cats):
        api_package(repo)
    if "agent_multi_turn" in cats and user is None:
        raise MissingDataset("acebench: agent_multi_turn's user is an LLM: pass "
                             "--acebench_user_endpoint URL (an OpenAI-compatible server) and "
                             "--acebench_user_model NAME (the authors: gpt-4o)")
    # every file checked before any sampling
    data = {c: load_category(data_dir, c, limit) for c in cats}
    needed = {n for c in cats if c.startswith("agent") for e in data[c]
              for n in e["involved_classes"]}
    classes = load_api_classes(repo, sorted(needed)) if needed else {}
    scores, records = {}, []
    for cat in cats:
        if cat.startswith("agent"):
            role = {**ROLE_SAMPLING, "max_new_tokens": agent_max_new_tokens,
                    "seed": sampling.get("seed")}
            got, recs = _agent(sampler, user, data[cat], cat, classes, batch_size, role,
                               multi_step_language)
        else:
            got, recs = _single_turn(sampler, data[cat], cat, sampling, batch_size)
        scores.update(got)
        records += recs
    metrics = {f"acebench/{k}": v for k, v in {**scores, **summary(scores)}.items()}
    metrics["acebench/items"] = sum(len(v) for v in data.values())
    return metrics, records
