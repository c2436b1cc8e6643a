"""Environment memory: selection thresholds and order, the rendered block, persistence."""
import json
import os
import random

import pytest

import memory
from memory import EnvironmentMemory, MemoryFileError, MemoryRecord
from scripted import seeded


def rec(name, win_rate, regret, skill="Mathematical Reasoning", step=0, source=None):
    return MemoryRecord(skill=skill, source=source or f"class {name}:\n    pass\n", win_rate=win_rate,
                        regret=regret, step=step, class_name=name)


def load(path):
    """memory.json read back (train.py resumes from the checkpoint's to_dict(), not this file)."""
    return EnvironmentMemory.from_dict(json.loads(path.read_text(encoding="utf-8")), path=path)


def test_fifo_capacity_drops_oldest():
    mem = EnvironmentMemory(capacity=3)
    for i in range(5):
        mem.add(rec(f"E{i}Env", 0.5, 0.1, step=i))
    assert len(mem.records) == 3
    assert [r.class_name for r in mem.records] == ["E2Env", "E3Env", "E4Env"]


def test_positive_thresholds_are_inclusive_and_same_skill_only():
    mem = EnvironmentMemory()
    for name, w in [("LowEdgeEnv", 0.15), ("HighEdgeEnv", 0.85), ("BelowEnv", 0.149), ("AboveEnv", 0.851)]:
        mem.add(rec(name, w, 0.2))
    mem.add(rec("OtherSkillEnv", 0.5, 0.9, skill="Optimization"))
    picked = seeded(mem, random.Random(0)).positives("Mathematical Reasoning")
    assert {r.class_name for r in picked} == {"LowEdgeEnv", "HighEdgeEnv"}
    assert seeded(mem, random.Random(0)).positives("Causal Inference") == []


def test_positives_come_from_top_10_by_regret_in_draw_order():
    mem = EnvironmentMemory()
    for i in range(15):  # regrets 0.00 .. 0.14; the top 10 are E14..E5
        mem.add(rec(f"E{i}Env", 0.5, i / 100))
    top = [f"E{i}Env" for i in range(14, 4, -1)]
    seen = set()
    for seed in range(200):
        picked = [r.class_name for r in seeded(mem, random.Random(seed)).positives("Mathematical Reasoning")]
        assert picked == random.Random(seed).sample(top, 2)  # the authors' draw: rng.sample(top10, 2)
        seen |= set(picked)
    assert seen == set(top)


def test_equal_regret_keeps_older_records_first():
    """A stable ranking: among equal regrets the older records fill the top 10 (as the authors')."""
    mem = EnvironmentMemory()
    for i in range(12):
        mem.add(rec(f"E{i}Env", 0.5, 0.3, step=i))
    seen = set()
    for seed in range(100):
        seen |= {r.class_name for r in seeded(mem, random.Random(seed)).positives("Mathematical Reasoning")}
    assert seen == {f"E{i}Env" for i in range(10)}


def test_negative_thresholds_are_strict_and_the_draw_is_uniform():
    mem = EnvironmentMemory()
    mem.add(rec("EdgeEasyEnv", 0.9, 0.0))   # exactly 0.9 is not "too easy"
    mem.add(rec("EdgeHardEnv", 0.1, 0.0))   # exactly 0.1 is not "too hard"
    assert mem.negative("Mathematical Reasoning") is None
    mem.add(rec("HardEnv", 0.05, 0.0, step=1))
    mem.add(rec("EasyEnv", 0.95, 0.0, step=2))
    mem.add(rec("OtherEnv", 1.0, 0.0, skill="Optimization"))
    draws = [seeded(mem, random.Random(seed)).negative("Mathematical Reasoning").class_name for seed in range(400)]
    assert draws == [random.Random(seed).sample(["HardEnv", "EasyEnv"], 1)[0] for seed in range(400)]
    assert 150 < draws.count("EasyEnv") < 250  # uniform over the two
    assert mem.negative("Causal Inference") is None


def test_draws_are_seeded_and_their_state_is_checkpointed():
    mem = EnvironmentMemory(seed=3)
    for i in range(6):
        mem.add(rec(f"P{i}Env", 0.5, i / 10, step=i))
        mem.add(rec(f"N{i}Env", 0.0, 0.0, step=i))
    mem.prompt_block("Mathematical Reasoning")  # advance the memory's own rng
    restored = EnvironmentMemory.from_dict(json.loads(json.dumps(mem.to_dict())))
    ahead = [mem.prompt_block("Mathematical Reasoning") for _ in range(5)]
    assert [restored.prompt_block("Mathematical Reasoning") for _ in range(5)] == ahead
    again = EnvironmentMemory(seed=3)
    for r in mem.records:
        again.add(r)
    again.prompt_block("Mathematical Reasoning")
    assert again.prompt_block("Mathematical Reasoning") == ahead[0]
    assert len({b.split("Avoid environments like ")[1] for b in ahead}) > 1  # not a fixed pick


def test_prompt_block_contents():
    mem = EnvironmentMemory()
    assert seeded(mem, random.Random(0)).prompt_block("Mathematical Reasoning") == ""
    long_source = "class LongEnv:\n" + "    x = 1\n" * 400  # ~4,000 characters
    mem.add(rec("LongEnv", 0.4, 0.25, source=long_source))
    mem.add(rec("TrivialEnv", 1.0, 0.0))
    block = seeded(mem, random.Random(0)).prompt_block("Mathematical Reasoning")
    assert block.startswith("<REFERENCE_ENVIRONMENTS>")
    assert "</REFERENCE_ENVIRONMENTS>" in block
    assert "LongEnv" in block and "win rate 0.40" in block and "regret 0.25" in block
    assert "DIFFERENT" in block
    assert long_source[:memory.CODE_CHARS] in block and long_source[:memory.CODE_CHARS + 10] not in block
    assert "truncated" in block
    assert block.rstrip().endswith("it was too easy for the agent (win rate 1.00).")
    assert "TrivialEnv" in block.split("</REFERENCE_ENVIRONMENTS>")[1]


def test_prompt_block_negative_only_has_no_tags():
    mem = EnvironmentMemory()
    mem.add(rec("ImpossibleEnv", 0.0, 0.0))
    block = seeded(mem, random.Random(0)).prompt_block("Mathematical Reasoning")
    assert block == "Avoid environments like ImpossibleEnv: it was too hard for the agent (win rate 0.00)."


def test_record_validation():
    with pytest.raises(ValueError):
        rec("BadEnv", 1.5, 0.0)
    with pytest.raises(ValueError):
        rec("BadEnv", 0.5, float("nan"))


def test_save_load_round_trip(tmp_path):
    path = tmp_path / "mem" / "memory.json"
    mem = EnvironmentMemory(capacity=5, path=path)
    for i in range(7):
        mem.add(rec(f"E{i}Env", i / 10, i / 20, step=i, skill="Optimization"))
    assert mem.save() == path
    back = load(path)
    assert back.capacity == 5 and back.path == path
    assert back.records == mem.records
    assert back.to_dict() == mem.to_dict()
    again = EnvironmentMemory.from_dict(json.loads(json.dumps(mem.to_dict())))
    assert again.records == mem.records
    assert [p for p in os.listdir(path.parent)] == ["memory.json"]  # no temp files left behind


def test_save_without_path_is_an_error():
    with pytest.raises(ValueError, match="path"):
        EnvironmentMemory().save()


def test_crash_mid_save_leaves_previous_file_intact(tmp_path, monkeypatch):
    path = tmp_path / "memory.json"
    mem = EnvironmentMemory(path=path)
    mem.add(rec("FirstEnv", 0.5, 0.1))
    mem.save()
    before = path.read_bytes()
    mem.add(rec("SecondEnv", 0.5, 0.2))

    def crash(src, dst):
        raise OSError("simulated crash before rename")
    monkeypatch.setattr(memory.os, "replace", crash)
    with pytest.raises(OSError, match="simulated crash"):
        mem.save()
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["memory.json"]
    monkeypatch.undo()
    assert [r.class_name for r in load(path).records] == ["FirstEnv"]


def test_crash_while_writing_json_leaves_previous_file_intact(tmp_path, monkeypatch):
    path = tmp_path / "memory.json"
    mem = EnvironmentMemory(path=path)
    mem.add(rec("FirstEnv", 0.5, 0.1))
    mem.save()
    before = path.read_bytes()

    def crash(*args, **kwargs):
        raise KeyboardInterrupt  # even a BaseException must not leave a half-written file
    monkeypatch.setattr(memory.json, "dump", crash)
    with pytest.raises(KeyboardInterrupt):
        mem.save()
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["memory.json"]


@pytest.mark.parametrize("content", [
    "[]",                                                                             # wrong shape
    '{"version": 99, "capacity": 200, "records": []}',                                # unknown version
    '{"version": 2, "capacity": 0, "records": []}',                                   # bad capacity
    '{"version": 2, "capacity": 200, "records": []}',                                 # no rng state
    '{"version": 2, "capacity": 200, "rng": RNG, "records": [{"skill": "x"}]}',       # missing fields
    '{"version": 2, "capacity": 200, "rng": RNG, "records": [{"skill": "x", "source": "", "win_rate": 7, '
    '"regret": 0, "step": 0, "class_name": "XEnv", "setting": "games"}]}',            # bad win rate
    '{"version": 2, "capacity": 200, "rng": RNG, "records": [[]]}',                   # not a record
])
def test_corrupt_memory_is_a_clear_error(content):
    rng = json.dumps(EnvironmentMemory().to_dict()["rng"])
    with pytest.raises(MemoryFileError):
        EnvironmentMemory.from_dict(json.loads(content.replace("RNG", rng)))
