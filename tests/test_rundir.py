"""rundir.py: the readers tools/report.py and tools/export.py share read back what the run's
writers write, field for field, and a transcript line by its fields, whatever their order."""
import json
from types import SimpleNamespace

from infra import rundir


def pool_env(env_id, source):
    return SimpleNamespace(env_id=env_id, skill="Math", origin="designer", class_name="Coin",
                           hint="say heads", regret=0.5, r_hint=1.0, r_nohint=0.5,
                           returns=[1.0, 0.0], faulty=False, source=source)


def episode(env_id, hinted, seed):
    return SimpleNamespace(env_id=env_id, seed=seed, hinted=hinted, ret=float(hinted),
                           status="terminated", error=None, actions=["\\boxed{H}"],
                           rendered_prompt="<prompt>", messages=[{"role": "user", "content": "?"}])


def test_the_readers_read_what_the_writers_write(tmp_path):
    one_rank = SimpleNamespace(is_main_process=True, wait_for_everyone=lambda: None)
    cfg = {"model": "tiny", "setting": "games", "steps": 4}
    flags = SimpleNamespace(resume=False, overwrite=False)
    tmp_path = tmp_path / "run"
    assert rundir.prepare_run_dir(tmp_path, cfg, flags, one_rank) is None
    envs = [pool_env("s2-r1-e0", "class Coin: pass\n"), pool_env("s2:r1:e1", "class Two: pass\n")]
    plays = [episode(e.env_id, h, seed) for e in envs for seed, h in ((1, False), (2, True))]
    attempts = [{"skill": "Math", "slot": 0, "attempt": 1, "ok": True, "source": envs[0].source}]
    scored = [SimpleNamespace(env=SimpleNamespace(env_id="s0-r1-e0"), score=0.75, prompt=[1])]
    rundir.write_step_files(tmp_path, 2, envs, plays, 2, attempts, rank=1, scored=scored)
    rundir.append_metrics(tmp_path, {"charts/step": 2, "agent/return_mean": 0.5})
    run = rundir.load_run(tmp_path)
    assert run["config"] == cfg
    assert sorted(p.name for p in (tmp_path / "envs" / "step-0002-rank-1").iterdir()) == [
        "pool.json", "s2-r1-e0.py", "s2_r1_e1.py"]  # ":" is "_" in a file name
    (first, second), = run["pools"].values()
    assert first == {"env_id": "s2-r1-e0", "skill": "Math", "origin": "designer",
                     "class_name": "Coin", "hint": "say heads", "regret": 0.5, "r_hint": 1.0,
                     "r_nohint": 0.5, "returns": [1.0, 0.0], "faulty": False, "step": 2, "rank": 1,
                     "file": tmp_path / "envs" / "step-0002-rank-1" / "s2-r1-e0.py"}
    assert rundir.read_source(second, run["notes"]) == "class Two: pass\n"
    assert run["attempts"] == {2: [dict(attempts[0], rank=1)]}
    rundir.read_source(first, run["notes"])  # an attempt is matched by its source
    assert rundir.attempt_of(run, first) == dict(attempts[0], rank=1)
    assert rundir.attempt_of(run, second) == {}
    assert run["scores"] == {"s0-r1-e0": 0.75}
    assert run["rows"] == [{"agent/return_mean": 0.5, "charts/step": 2}]
    logged = rundir.read_transcripts(run, 2, {"s2:r1:e1"})
    assert list(logged) == ["s2:r1:e1"]
    assert [(t["seed"], t["hinted"], t["return"], t["step"]) for t in logged["s2:r1:e1"]] == [
        (1, False, 0.0, 2), (2, True, 1.0, 2)]
    assert logged["s2:r1:e1"][0]["rendered_prompt"] == "<prompt>"
    assert run["notes"] == ["memory.json is missing"]


def test_a_transcript_line_is_read_by_its_fields_whatever_their_order(tmp_path):
    """A line is one JSON object: env_id need not come first (these are sorted after "actions"),
    and another play that holds the id as a string is not that id's play."""
    (tmp_path / "transcripts").mkdir()
    rows = [{"env_id": "a", "seed": 1, "actions": ["b"]},
            {"env_id": "b", "seed": 2, "actions": ["x"]}, {"env_id": "c", "seed": 3}]
    (tmp_path / "transcripts" / "step-0000-rank-0.jsonl").write_text(
        "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows) + '{"env_id": "b", "se')
    run = rundir.load_run(tmp_path)
    logged = rundir.read_transcripts(run, 0, {"b"})
    assert [t["seed"] for t in logged["b"]] == [2] and list(logged) == ["b"]
    # the cut last line names "b": noted, as a run still writing leaves it
    assert run["notes"][-1].startswith("transcripts/step-0000-rank-0.jsonl: 1 unreadable line")


def test_a_resume_cuts_metrics_back_to_its_checkpoint(tmp_path):
    for step in range(3):
        rundir.append_metrics(tmp_path, {"charts/step": step})
    assert rundir.metrics_lines(tmp_path) == 3
    rundir.cut_metrics(tmp_path, 2)
    assert (tmp_path / "metrics.jsonl").read_text() == '{"charts/step": 0}\n{"charts/step": 1}\n'
    (tmp_path / "checkpoint-2").mkdir()
    rundir.atomic_write(tmp_path / "checkpoint-2" / "spade_state-1.json", json.dumps({"step": 2}))
    assert rundir.load_state(tmp_path / "checkpoint-2", 1) == {"step": 2}
    assert not list(tmp_path.glob("**/*.tmp"))  # written beside, renamed into place
