"""report.py: the HTML page of a tiny end-to-end run (`python -m tools.report RUN_DIR`) has every
section and card, shows the run files' values, escapes model-written text, survives partial run
directories, stays bounded on a large run, and renders in headless Chromium; the training run
never imports it."""
import ast
import sys
import json
import os
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from tools import report
import train
from runs import BASE, COIN
from scripted import TeacherForced, in_turn, main_with, per_prompt

ROOT = Path(__file__).resolve().parents[1]

# Model-written text that would break the page if it were not escaped.
HOSTILE = "<script>alert(1)</script></div></pre></details>"
VOID = {"meta", "br", "img", "hr", "input", "link", "path", "use", "rect", "circle", "line",
        "polyline", "polygon", "stop", "image", "col"}
SECTIONS = ["header", "curves", "heldout", "telemetry", "cards", "designer"]
# the held-out suites at steps 0, 2 and after the last (3): one panel per suite
EVAL = ["--eval_every", "2", "--eval_suites", "aime2025,gpqa_diamond", "--eval_args",
        f"--data_dir {ROOT / 'tests' / 'fixtures' / 'eval'} --aime_samples 2 --gpqa_samples 1 "
        "--max_new_tokens 4 --limit 2"]


class Page(HTMLParser):
    """Start tags with attributes, text, and tag balance (every end tag closes the open element)."""

    def __init__(self, text):
        super().__init__(convert_charrefs=True)
        self.tags, self.text, self.stack, self.errors = [], [], [], []
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_endtag(self, tag):
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1:] or 'nothing'}")
        else:
            self.stack.pop()

    def handle_data(self, data):
        self.text.append(data)

    def having(self, **attrs):
        return [a for _, a in self.tags if all(a.get(k) == v for k, v in attrs.items())]

    def fields(self, cls_id):
        """{data-field: text} inside the element with this id (cards and the header)."""
        return FieldReader(self.raw, cls_id).fields


class FieldReader(HTMLParser):
    def __init__(self, text, element_id):
        super().__init__(convert_charrefs=True)
        self.target, self.depth, self.current, self.fields = element_id, 0, None, {}
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if self.depth or a.get("id") == self.target:
            self.depth += tag not in VOID
            if "data-field" in a:
                self.current = a["data-field"]

    def handle_endtag(self, tag):
        if self.depth:
            self.depth -= 1
            self.current = None

    def handle_data(self, data):
        if self.current:
            self.fields[self.current] = data


def parse(text):
    page = Page(text)
    page.raw = text
    return page


def scripted_hostile(model, tok):
    """A scripted designer (a fair coin whose observation and code carry HOSTILE, a syntax error)
    and an agent whose replies (also used as hints) carry HOSTILE."""
    coin = COIN.replace("FAIR", "True").replace("Call the coin:", f"Call the coin {HOSTILE}:")
    coin = f"# designer note: {HOSTILE}\n{coin}"
    designs = [f"```python\n{coin}\n```", "```python\nclass BrokenEnv(:\n    pass\n```"]
    replies = [f"I call it. {HOSTILE} \\boxed{{heads}}", "Hmm. \\boxed{tails}"]
    return {"designer": TeacherForced(model, tok, in_turn(designs)),
            "agent": TeacherForced(model, tok, per_prompt(replies))}


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, tiny):
    """Two regenerations (steps 0 and 2), held-out suites at steps 0, 2 and 3, its page made by
    the command the run prints."""
    out = tmp_path_factory.mktemp("report") / "run"
    run = main_with(scripted_hostile(*tiny), BASE + EVAL + ["--transcripts", "2",
                                                            "--output_dir", str(out)])
    assert not (run / "report.html").exists()  # the run writes its files, never the page
    subprocess.run([sys.executable, "-m", "tools.report", str(run)], cwd=ROOT, check=True,
                   capture_output=True, timeout=300)
    return run


def pools(run):
    out = {}
    for d in sorted((run / "envs").iterdir()):
        out[int(d.name.split("-")[1])] = json.loads((d / "pool.json").read_text())
    return out


@pytest.mark.slow
def test_report_has_every_section_and_card(tiny_run):
    text = (tiny_run / "report.html").read_text()  # written by `python -m tools.report`
    page = parse(text)
    assert not page.errors and not page.stack
    for sid in SECTIONS:
        assert page.having(id=sid), sid
    charts = {a["data-chart"] for a in page.having() if "data-chart" in a}
    assert len(charts) == 13 and text.count("<svg") == 13
    assert {"Held-out: aime2025", "Held-out: gpqa_diamond"} <= charts
    for step, pool in pools(tiny_run).items():
        assert page.having(id=f"regen-{step}")
        cards = [a for a in page.having(**{"class": "card"}) if a["data-step"] == str(step)]
        assert len(cards) == min(report.CARDS, len(pool))
        # designer-written environments first: every one of them has a card
        designed = [e["env_id"] for e in pool if e["origin"] == "designer"]
        assert designed and [c["data-env"] for c in cards[:len(designed)]] == designed[:report.CARDS]
    # every transcript link points into the page
    ids = {a.get("id") for a in page.having()}
    links = [a["href"][1:] for a in page.having() if a.get("href", "").startswith("#")]
    assert links and set(links) <= ids
    assert any(i.endswith("-t1") for i in ids)  # a designer card shows its hinted play too
    assert page.having(**{"class": "turn err"}) == [] or "env_error" in text
    assert "syntax" in {a.get("data-reason") for a in page.having()}
    # each play shows the first prompt the agent read (chat template and all), as the run logged it
    plays = [json.loads(x) for x in (tiny_run / "transcripts" / "step-0000-rank-0.jsonl").open()]
    assert plays and all(p["rendered_prompt"].startswith("<|im_start|>") for p in plays)
    assert plays[0]["messages"][0]["content"] in plays[0]["rendered_prompt"]
    assert len(page.having(**{"class": "prompt"})) == len(ids & {i for i in ids if "-t" in (i or "")})


@pytest.mark.slow
def test_report_values_equal_the_run_files(tiny_run):
    text = report.render(tiny_run)
    page = parse(text)
    rows = [json.loads(line) for line in (tiny_run / "metrics.jsonl").read_text().splitlines()]
    head = page.fields("header")
    assert int(head["steps_done"]) == len(rows) - 1 == 3  # the last evaluation has a row of its own
    assert "time/step_s" not in rows[-1]
    rows = rows[:-1]
    best = json.loads((tiny_run / "eval" / "checkpoints.json").read_text())
    assert f"step-{page.fields('heldout')['eval_best']}" == best["best"]
    assert float(head["time_step"]) == pytest.approx(sum(r["time/step_s"] for r in rows), abs=0.05)
    assert float(head["time_play"]) == pytest.approx(sum(r["time/play_s"] for r in rows), abs=0.05)
    scores = json.loads((tiny_run / "designer" / "scores-step-0002-rank-0.json").read_text())
    memory = json.loads((tiny_run / "memory.json").read_text())["records"]
    env = next(e for e in pools(tiny_run)[0] if e["origin"] == "designer")
    card = next(a["id"] for a in page.having(**{"class": "card"}, **{"data-step": "0"})
                if a["data-env"] == env["env_id"])
    f = page.fields(card)
    assert float(f["regret"]) == pytest.approx(env["regret"], abs=5e-4)
    assert float(f["r_hint"]) == pytest.approx(env["r_hint"], abs=5e-4)
    assert float(f["r_nohint"]) == pytest.approx(sum(env["returns"]) / len(env["returns"]), abs=5e-4)
    assert float(f["score"]) == pytest.approx(
        next(s["score"] for s in scores if s["env_id"] == env["env_id"]), abs=5e-4)
    attempts = [json.loads(line) for line in (tiny_run / "designer" / "step-0000-rank-0.jsonl").open()]
    doc = next(a for a in attempts if a["ok"])
    assert doc["doc_title"] and f["doc_title"] == doc["doc_title"]
    rec = next(r for r in memory if r["step"] == 0)
    assert float(f["memory_win_rate"]) == pytest.approx(rec["win_rate"], abs=5e-4)
    assert str(len(rows)) in head["steps_done"]
    # the curves are drawn from the metric keys the README documents
    assert "agent/return_mean" in text and "designer/first_attempt_validity_rate" in text


@pytest.mark.slow
def test_model_written_text_cannot_change_the_page(tiny_run):
    text = report.render(tiny_run)
    page = parse(text)
    assert not page.errors and not page.stack  # no stray </div> or </pre> closed anything
    assert "script" not in {t for t, _ in page.tags}  # the page itself has no script at all
    shown = "".join(page.text)
    # the hostile text is on the page as text: in the code, the observation, a reply, the hint
    assert shown.count(HOSTILE) >= 4
    assert page.having(**{"class": "action"})  # the parsed action is highlighted in a reply


@pytest.mark.slow
def test_partial_run_directory_gives_a_report_and_notes(tiny_run, tmp_path):
    run = tmp_path / "partial"
    shutil.copytree(tiny_run, run, ignore=shutil.ignore_patterns("checkpoint-*", "final_model"))
    metrics = run / "metrics.jsonl"
    # a run killed while writing its last step's line (before its last evaluation's row)
    metrics.write_text("".join(metrics.read_text().splitlines(keepends=True)[:-1])[:-40])
    victim = next((run / "envs").glob("step-0000-rank-0/s0*.py"))
    victim.unlink()
    (run / "memory.json").unlink()
    (run / "config.json").write_text("{not json")
    text = report.render(run)
    page = parse(text)
    assert not page.errors
    notes = " ".join(page.text)
    assert "1 unreadable line(s) skipped" in notes and f"{victim.name} is missing" in notes
    assert "config.json could not be read" in notes and "source file missing" in notes
    assert int(page.fields("header")["steps_done"]) == 2
    shutil.rmtree(run / "envs")
    (run / "metrics.jsonl").unlink()
    assert "no envs/ pools logged yet" in report.render(run)


def test_a_directory_that_is_not_a_run_is_a_clear_error(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("hello")
    assert report.main([str(tmp_path)]) == 2
    assert "is not a SPADE run directory" in capsys.readouterr().err
    assert report.main([str(tmp_path / "nowhere")]) == 2
    assert "is not a directory" in capsys.readouterr().err
    assert not (tmp_path / "report.html").exists()
    (tmp_path / "metrics.jsonl").write_text("")  # a run, but --out points nowhere
    assert report.main([str(tmp_path), "--out", str(tmp_path / "no" / "such" / "r.html")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("report.py: cannot write ") and err.count("\n") == 1


def test_the_training_run_never_imports_the_report():
    """No library module imports tools/ (not even lazily), and importing the loop and the
    evaluation driver loads neither the report nor its drawing packages."""
    library = [*ROOT.glob("*.py"), *ROOT.glob("infra/*.py"), *ROOT.glob("suites/*.py")]
    edges = [f"{p.relative_to(ROOT)}:{n.lineno}" for p in library
             for n in ast.walk(ast.parse(p.read_text(encoding="utf-8")))
             if isinstance(n, ast.Import) and any(a.name.split(".")[0] == "tools" for a in n.names)
             or isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[0] == "tools"]
    assert not edges and len(library) > 15, edges
    code = ("import sys, train, eval; bad = [m for m in sys.modules if m.split('.')[0] in "
            "('tools', 'matplotlib', 'pygments')]; assert not bad, bad")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-2000:]


def test_fields_of_unexpected_types_still_give_a_page(tmp_path):
    """Valid JSON of the wrong shape (a hand-edited file, another version's): every card drawn."""
    run = fake_run(tmp_path, regens=1, n_envs=3, interval=4, source="x = 1\n", turns=1, reply_chars=10)
    pool_file = run / "envs" / "step-0000-rank-0" / "pool.json"
    pool = json.loads(pool_file.read_text())
    pool[0].update(returns=5, origin=["designer"], regret="high", hint={"a": 1}, r_hint=None)
    pool[1].update(skill=None, class_name=7)
    pool_file.write_text(json.dumps(pool))
    plays = run / "transcripts" / "step-0000-rank-0.jsonl"
    rows = [json.loads(line) for line in plays.read_text().splitlines()]
    rows[0].update(messages=3, actions="abc")
    rows[2].update(messages=["text", {"role": None, "content": 4}], actions=[{"tool": "x"}], error=["e"])
    plays.write_text("".join(json.dumps(r) + "\n" for r in rows) + "[1, 2]\n")
    (run / "designer" / "scores-step-0004-rank-0.json").write_text(json.dumps({"s0-r0-e0": 1}))
    (run / "memory.json").write_text(json.dumps({"records": {"a": 1}}))
    text = report.render(run, cards=3)
    page = parse(text)
    assert not page.errors and "could not be drawn" not in text
    assert len(page.having(**{"class": "card"})) == 3


def test_metric_keys_are_found_after_a_namespace_rename():
    rows = [{"curriculum/learnable_share": 0.5, "designer/mean": 1.0, "charts/step": 0}]
    assert report.find_key(rows, "env/learnable_share") == "curriculum/learnable_share"
    assert report.find_key(rows, "regret/mean") is None  # "mean" says nothing about regret
    assert report.series(rows, "curriculum/learnable_share") == ([0], [0.5])


def fake_run(root: Path, *, regens: int, n_envs: int, interval: int, source: str,
             turns: int, reply_chars: int) -> Path:
    """A run directory in train.py's formats, at paper-like sizes, without training."""
    run = root / "big"
    (run / "transcripts").mkdir(parents=True)
    (run / "designer").mkdir()
    (run / "config.json").write_text(json.dumps({"model": "Qwen3-8B", "setting": "games",
                                                 "steps": regens * interval}))
    rows = [{"charts/step": s, "agent/return_mean": s / (regens * interval), "env/learnable_share": 0.4,
             "time/step_s": 60.0, "time/regenerate_s": 20.0, "time/play_s": 30.0, "time/update_s": 9.0,
             **({"designer/validity_rate": 0.7, "designer/first_attempt_validity_rate": 0.5,
                 "designer/diversity": 12.0, "regret/mean": 0.1, "regret/positive_share": 0.6,
                 "agent/hinted_return_mean": 0.5} if s % interval == 0 else {})}
            for s in range(regens * interval)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for g in range(regens):
        step, tag = g * interval, f"step-{g * interval:04d}-rank-0"
        d = run / "envs" / tag
        d.mkdir(parents=True)
        pool = [{"env_id": f"s{step}-r0-e{i}", "skill": "Optimization", "origin": "designer",
                 "class_name": f"Env{i}", "hint": "Think. " * 60, "regret": 0.1 * (i % 5),
                 "r_hint": 0.5, "r_nohint": 0.4, "returns": [0.0, 1.0] * 4} for i in range(n_envs)]
        (d / "pool.json").write_text(json.dumps(pool))
        for e in pool:
            (d / f"{e['env_id']}.py").write_text(source)
        reply = ("reasoning " * reply_chars)[:reply_chars] + " \\boxed{3}"
        msgs = [{"role": "user", "content": "Observation: " + "x" * 2000}]
        msgs += [m for _ in range(turns) for m in ({"role": "assistant", "content": reply},
                                                   {"role": "user", "content": "Feedback. " * 50})]
        plays = [{"env_id": e["env_id"], "seed": 1, "hinted": h, "return": 1.0, "status": "terminated",
                  "error": None, "actions": ["\\boxed{3}"] * turns, "messages": msgs}
                 for e in pool for h in (False, True)]
        (run / "transcripts" / f"{tag}.jsonl").write_text("".join(json.dumps(p) + "\n" for p in plays))
        attempts = [{"skill": "Optimization", "slot": i, "attempt": 1, "ok": True, "reason": None,
                     "doc_id": f"doc-{i}", "repaired": False, "source": source, "class_name": f"Env{i}"}
                    for i in range(n_envs)] + [{"skill": "Optimization", "slot": 0, "attempt": 2, "ok": False,
                                                "reason": "timeout", "error": "step() took 5 s", "source": source}]
        (run / "designer" / f"{tag}.jsonl").write_text("".join(json.dumps(a) + "\n" for a in attempts))
    return run


def test_report_of_a_paper_sized_run_stays_bounded(tmp_path):
    """20 regenerations of 24 environments with 200-line sources and 25-turn plays: the default
    --cards and cuts keep the page at about 40 kB per regeneration (a 400-step run, 100
    regenerations, about 4 MB)."""
    src = (Path(train.__file__).parent / "data" / "envs" / "cargo_loading.py").read_text()
    src = "\n".join((src.splitlines() * 3)[:200])
    run = fake_run(tmp_path, regens=20, n_envs=24, interval=4, source=src, turns=25, reply_chars=4000)
    out = report.write_report(run)
    size = out.stat().st_size
    page = parse(out.read_text())
    assert not page.errors
    assert len(page.having(**{"class": "card"})) == 20 * report.CARDS
    assert size < 20 * 50_000, size
    text = "".join(page.text)
    assert "22 more not shown (--cards 2)" in text and "more lines not shown (--source_lines 150)" in text
    assert "more message(s) not shown (--transcript_chars 3000" in text


def chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)
    return None


@pytest.mark.slow
@pytest.mark.needs_chromium
def test_report_renders_in_headless_chromium(tiny_run, tmp_path):
    """Screenshot the page and read back the DOM the browser built. REPORT_SCREENSHOT=path keeps
    the screenshot (docs/report.png, shown in docs/run.md)."""
    exe = chromium()  # there: needs_chromium skipped the test otherwise (tests/conftest.py)
    html_file = tiny_run / "report.html"
    shot = tmp_path / "report.png"
    flags = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1280,1700"]
    env = dict(os.environ, HOME=str(tmp_path))
    try:
        subprocess.run(flags + [f"--screenshot={shot}", html_file.as_uri()], env=env,
                       capture_output=True, timeout=120, check=True)
        dom = subprocess.run(flags + ["--dump-dom", html_file.as_uri()], env=env,
                             capture_output=True, text=True, timeout=120, check=True).stdout
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as e:
        pytest.skip(f"chromium could not start here: {e}")
    from PIL import Image
    img = Image.open(shot).convert("RGB")
    assert img.size == (1280, 1700)
    colors = img.getcolors(maxcolors=1 << 20)
    white = max(colors)[0] / (img.size[0] * img.size[1])
    assert len(colors) > 100 and white < 0.95  # text, curves and code, not a blank page
    page = parse(dom)
    cards = page.having(**{"class": "card"})
    assert len(cards) == len(parse(html_file.read_text()).having(**{"class": "card"})) >= 2
    assert "script" not in {t for t, _ in page.tags}
    # the held-out curves as the browser built them: a panel per suite, its untrained value dashed
    held = FieldReader(dom, "heldout").fields
    assert held["eval_best"].isdigit()
    for suite in ("aime2025", "gpqa_diamond"):
        [chart] = page.having(**{"data-chart": f"Held-out: {suite}"})
        svg = dom[dom.index(f'data-chart="Held-out: {suite}"'):]
        svg = svg[:svg.index("</figure>")]
        assert "untrained" in svg and "stroke-dasharray" in svg and f"eval/{suite}/avg@" in svg
    if os.environ.get("REPORT_SCREENSHOT"):  # small enough to check in: 960 px, 64 colours
        small = img.resize((960, 1275), Image.LANCZOS).quantize(64)
        small.save(os.environ["REPORT_SCREENSHOT"], optimize=True)


def test_telemetry_panel_draws_the_step_telemetry(tmp_path):
    run = fake_run(tmp_path, regens=1, n_envs=1, interval=2, source="class E: pass", turns=1,
                   reply_chars=10)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    for r, mfu in zip(rows, (0.3, 0.5)):
        r.update({"perf/mfu": mfu, "perf/update_tokens_per_s": 900.0, "mismatch/k3": 1e-3,
                  "time/sync_s": 2.0})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    page = parse(report.render(run))
    assert float(page.fields("telemetry")["mfu"]) == pytest.approx(0.4)
    charts = {a["data-chart"] for a in page.having() if "data-chart" in a}
    assert {t for t, _, _ in report.TELEMETRY} <= charts
    text = "".join(page.text)
    assert "perf/update_tokens_per_s" in text and "mismatch/k3" in text and "time/sync_s" in text
    rows[0].pop("perf/mfu"), rows[1].pop("perf/mfu")
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert "no perf/mfu" in "".join(parse(report.render(run)).text)  # a CPU run: said, not drawn


def drawn_figures(monkeypatch, run) -> dict:
    """{chart title: its matplotlib figure} of the page of `run`, each drawn as the page draws it."""
    figs, real = {}, report.svg

    def spy(fig, name):
        figs[name] = fig
        return real(fig, name)
    monkeypatch.setattr(report, "svg", spy)
    report.render(run)
    return figs


def shown_ticks(axis) -> list[float]:
    lo, hi = sorted(axis.get_view_interval())
    return [t for t in axis.get_majorticklocs() if lo <= t <= hi]


def labels_uncut(fig) -> bool:
    """Every y tick label lies inside the figure (a fixed margin cut 0.00050 to ".00050")."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    renderer = FigureCanvasAgg(fig).get_renderer()
    return fig.axes[0].yaxis.get_tightbbox(renderer).x0 >= 0


def test_one_step_charts_read_as_one_step(tmp_path, monkeypatch):
    """A run of one step: each chart has one tick, at step 0 (not -0.04..0.04, nor a bar's
    -0.4..0.4), and a value with no spread gets a y range from the value (0 to twice it), not
    matplotlib's +-5 % around it."""
    run = fake_run(tmp_path, regens=1, n_envs=1, interval=1, source="class E: pass", turns=1,
                   reply_chars=10)
    row = json.loads((run / "metrics.jsonl").read_text())
    row.update({"time/sync_s": 0.00047, "perf/generate_tokens_per_s": 10.7, "mismatch/k3": 0.0,
                "designer/diversity_window": 12.000000000000002})  # one value, float noise
    (run / "metrics.jsonl").write_text(json.dumps(row) + "\n")
    figs = drawn_figures(monkeypatch, run)
    assert len(figs) == 11
    for title, fig in figs.items():
        ax = fig.axes[0]
        if ax.lines or ax.patches:  # a chart with data: its one step, centred
            assert shown_ticks(ax.xaxis) == [0.0] and ax.get_xlim() == (-1.0, 1.0), title
        assert all(t == int(t) for t in shown_ticks(ax.xaxis)), title
        assert labels_uncut(fig), title
    assert figs["Diversity (Vendi score)"].axes[0].get_ylim() == pytest.approx((0.0, 24.0))
    sync = figs["Weight sync and engine sleep / wake (s)"].axes[0]
    assert sync.get_ylim() == pytest.approx((0.0, 0.00094))
    assert figs["Rollout / trainer mismatch"].axes[0].get_ylim() == (-1.0, 1.0)  # around a 0
    assert figs["Agent return"].axes[0].get_ylim() == (-1.05, 1.05)  # a fixed range stays
    assert figs["Pool composition at each regeneration"].axes[0].get_ylim() == (0.0, 1.05)
    shutil.rmtree(run / "designer")  # the rejections from the metrics: counts of 0 at step 0
    (run / "metrics.jsonl").write_text(json.dumps({**row, "designer/rejected/no_code": 0}) + "\n")
    bars = drawn_figures(monkeypatch, run)["Rejected designer attempts by reason"].axes[0]
    assert bars.get_ylim() == (0.0, 1.0) and shown_ticks(bars.xaxis) == [0.0]


def test_tick_labels_are_the_values_themselves(tmp_path, monkeypatch):
    """Values near a large constant (sync seconds 1205.01..1205.03, steps 10000..10002) are
    labelled with their whole values: no offset text ("+1.205e3") in an axis corner."""
    run = fake_run(tmp_path, regens=1, n_envs=1, interval=3, source="class E: pass", turns=1,
                   reply_chars=10)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    for i, r in enumerate(rows):
        r.update({"charts/step": 10000 + i, "time/sync_s": 1205.01 + 0.01 * i,
                  "mismatch/k3": 2e-6 * (i + 1)})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    figs = drawn_figures(monkeypatch, run)
    for title, fig in figs.items():
        for axis in (fig.axes[0].xaxis, fig.axes[0].yaxis):
            assert axis.get_major_formatter().get_offset() == "", title
            ticks = axis.get_majorticklocs()
            labels = [t.get_text().replace("\N{MINUS SIGN}", "-")
                      for t in axis.get_majorticklabels()]
            assert [float(x) for x in labels] == pytest.approx(list(ticks), abs=1e-12), title
        assert labels_uncut(fig), title
    sync = figs["Weight sync and engine sleep / wake (s)"].axes[0]
    assert "1205.020" in [t.get_text() for t in sync.get_yticklabels()]
    lo, hi = sync.get_xlim()
    steps = [t.get_text() for t in sync.get_xticklabels() if lo <= t.get_position()[0] <= hi]
    assert steps == ["10000", "10001", "10002"]
