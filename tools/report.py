"""A SPADE run you can look at: its curriculum curves and the environments it wrote, one HTML page.

SPADE (arXiv 2608.19197) shows a run two ways: curves of the curriculum over training steps
(Sec. 4: agent return, hint-based regret (Eq. 3), learnable share, designer validity, diversity),
the held-out benchmarks over training when the run evaluated them (--eval_every: one panel per
suite, the untrained model's value dashed, the best step named as `eval.py --checkpoints` names
it, as Figs. 6, 11, 12, 14-16 plot them), and environment cards (Figure 2: the agent's first
observation, the designer-written code, the privileged hint). This file draws them from the run
directory `train.py` writes, into one self-contained HTML file: no network, no external assets
and no script; curves are inline SVG (matplotlib, Agg), code is highlighted by pygments, and
every piece of run text (observations, replies, sources, hints, error messages) is HTML-escaped,
so a model that writes `<script>` or `</div>` cannot change the page.

It reads only the run directory, through infra/rundir.py's readers (that module's docstring is
the directory's schema). A run still writing, a truncated last line or a missing file gives a
report of what is there and a note of what is not; a directory that holds none of the run's files
is an error (exit status 2). Metric keys are looked up by their README name, then by their last
component, so a renamed namespace still draws; a curve without data says so.

Size: at most `--cards` cards per regeneration (designer-written environments first, highest regret
first), sources cut at `--source_lines` lines and transcripts at `--transcript_chars` characters,
each cut said on the page.

Usage: `python -m tools.report RUN_DIR [--out FILE] [--cards N]` (default RUN_DIR/report.html),
during a run or after it; the training run never imports this module.
Dependencies: the standard library, matplotlib and pygments.
Test: `pytest tests/test_report.py -m ""` (-m "": the end-to-end run and the browser too).
"""
from __future__ import annotations

import argparse
import html
import io
import json
import math
import os
import sys
from itertools import zip_longest
from pathlib import Path

from infra import metrics, rundir

CARDS = 2               # cards per regeneration
SOURCE_LINES = 150      # lines of an environment's source shown on its card
TRANSCRIPT_CHARS = 3000  # characters of one transcript shown
TEXT_CHARS = 1500       # characters of an observation, hint or error shown


def esc(x) -> str:
    return html.escape(str(x), quote=True)


def num(x) -> float | None:
    """A finite float, or None (missing, null, a string, NaN)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
        return None
    return float(x)


def listof(x) -> list:
    """x if it is a list, else [] (a hand-edited or foreign file may hold anything)."""
    return x if isinstance(x, list) else []


def fmt(x, digits: int = 3) -> str:
    v = num(x)
    if v is None:
        return "n/a"
    return str(x) if isinstance(x, int) else f"{v:.{digits}f}"


def cut(text, limit: int) -> tuple[str, int]:
    """Keep the head and the tail of `text` (an action or an answer usually ends it); returns the
    kept text with a marker, and the number of characters left out."""
    text = "" if text is None else str(text)
    if len(text) <= limit:
        return text, 0
    half = limit // 2
    gone = len(text) - 2 * half
    return f"{text[:half]}\n[... {gone:,} characters not shown ...]\n{text[-half:]}", gone


# ----------------------------------------------------------------------------------------------
# Curves: metric series over steps, drawn with matplotlib as inline SVG.

# (title, [(label, README key)], y limits). Keys as in the README's metric table.
SHARE = (-0.02, 1.02)  # the y limits of a share in [0, 1]
CURVES = [
    ("Agent return", [("unhinted", "agent/return_mean"),
                      ("hinted", "agent/hinted_return_mean")], (-1.05, 1.05)),
    ("Regret (Eq. 3)", [("mean", "regret/mean"),
                        ("positive share", "regret/positive_share")], None),
    ("Learnable share", [("pool, per step", "env/learnable_share"),
                         ("slots, 16-step window (Fig. 7)", "env/learnable_slot_share")], SHARE),
    ("Designer validity", [("per attempt", "designer/validity_rate"),
                           ("first attempt", "designer/first_attempt_validity_rate")], SHARE),
    ("Diversity (Vendi score)", [("new sources", "designer/diversity"),
                                 ("40-step window (Fig. 19)", "designer/diversity_window")], None),
    ("Formula-reveal rate (Fig. 9)", [("new environments", "designer/formula_reveal_rate")], SHARE),
]


def find_key(rows: list[dict], key: str) -> str | None:
    """`key` if any row has it, else the one key that shares its last component when that is
    distinctive (a namespace renamed since this report was written: `learnable_share`, not
    `mean`), else None. The chart's caption names the key it drew."""
    keys = {k for r in rows for k in r}
    if key in keys:
        return key
    tail = key.rsplit("/", 1)[-1]
    same = sorted(k for k in keys if k.rsplit("/", 1)[-1] == tail)
    return same[0] if len(same) == 1 and len(tail) >= 8 else None


def series(rows: list[dict], key: str | None) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for i, r in enumerate(rows):
        v = num(r.get(key)) if key else None
        if v is not None:
            step = num(r.get("charts/step"))
            xs.append(int(step if step is not None else i))
            ys.append(v)
    return xs, ys


def svg(fig, name: str) -> str:
    """The figure as an <svg> element: text stays text, ids are unique per chart."""
    import matplotlib
    fit_left_margin(fig)
    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": name}):
        fig.savefig(buf, format="svg", metadata={"Date": None})
    text = buf.getvalue()
    return text[text.index("<svg"):]


LEFT = 0.1  # the left margin (a share of the figure's width) when the y labels fit in it


def new_axes(title: str):
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator
    fig = Figure(figsize=(5.0, 2.5), dpi=72)
    fig.subplots_adjust(left=LEFT, right=0.98, bottom=0.17, top=0.86)  # no layout pass
    ax = fig.add_subplot()
    ax.set_title(title, fontsize=10, loc="left")
    ax.set_xlabel("step", fontsize=8)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    # Labels are the values themselves: matplotlib's default labels values near a large constant
    # by an offset in the axis corner ("+1.205e3" over 0.01, 0.02), and small ones by a multiplier.
    ax.ticklabel_format(style="plain", useOffset=False)
    ax.tick_params(labelsize=8)
    ax.grid(alpha=0.3)
    return fig, ax


def fit_axes(ax, steps: list[int], values: list[float] | None) -> None:
    """Axes that read sensibly for one step of data. One step is one tick, the point or bar in
    the middle (MaxNLocator finds one whole step in the view and falls back to -0.04..0.04, or
    -0.4..0.4 under a bar). `values` with no spread (one point, a constant) get the y range 0 to
    twice their value, or -1..1 around 0, where matplotlib draws +-5 % of the value around it
    (0.000447..0.000494 for a single 0.00047) and ticks that read as a trend. None: y is set."""
    if len(set(steps)) == 1:
        ax.set_xlim(steps[0] - 1, steps[0] + 1)
        ax.set_xticks([steps[0]])
    if values and math.isclose(min(values), max(values), rel_tol=1e-9):  # 1.0, 0.9999999999
        value = max(values)
        ax.set_ylim(*sorted((0.0, 2 * value)) if value else (-1.0, 1.0))


def fit_left_margin(fig) -> None:
    """Widen the left margin to the widest y label: labels are whole values (0.00050, 1205.020),
    and a fixed margin cut their first digits (0.00050 read ".00050"). Measured with Agg: the
    page's SVG text is set in the same font (DejaVu Sans, matplotlib's)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    renderer = FigureCanvasAgg(fig).get_renderer()
    for ax in fig.axes:
        labels = ax.get_window_extent(renderer).x0 - ax.yaxis.get_tightbbox(renderer).x0
        fig.subplots_adjust(left=max(LEFT, (labels + 4) / fig.bbox.width))  # 4 px clear


def legend(ax) -> None:
    """Above the plot, right of the title: never over the data."""
    ax.legend(fontsize=7, loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=4, frameon=False,
              borderaxespad=0.2, handlelength=1.5, columnspacing=1.0)


def line_chart(rows: list[dict], title: str, lines, ylim) -> str:
    fig, ax = new_axes(title)
    drawn, steps, values = [], [], []
    for label, key in lines:
        found = find_key(rows, key)
        xs, ys = series(rows, found)
        if xs:
            ax.plot(xs, ys, marker="o" if len(xs) < 40 else None, markersize=3, linewidth=1.2,
                    label=label)
            drawn.append(found)
            steps, values = steps + xs, values + ys
    fit_axes(ax, steps, None if ylim else values)
    if ylim:
        ax.set_ylim(*ylim)
    if len(lines) > 1 and drawn:
        legend(ax)
    elif not drawn:
        ax.text(0.5, 0.5, "no data in metrics.jsonl", ha="center", va="center",
                transform=ax.transAxes)
    keys = ", ".join(find_key(rows, k) or k for _, k in lines)
    return chart_box(title, svg(fig, title), f"metrics.jsonl: {keys}")


def bar_chart(title: str, steps: list[int], stacks: dict[str, list[float]], source: str) -> str:
    fig, ax = new_axes(title)
    bottom = [0.0] * len(steps)
    width = max(0.8, 0.8 * min((b - a for a, b in zip(steps, steps[1:])), default=1))
    for label, vals in stacks.items():
        ax.bar(steps, vals, bottom=bottom, width=width, label=label)
        bottom = [b + v for b, v in zip(bottom, vals)]
    fit_axes(ax, steps, None)
    ax.set_ylim(0, max(bottom, default=0) * 1.05 or 1)  # bars stand on 0; no bars: 0..1
    if stacks:
        legend(ax)
    else:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
    return chart_box(title, svg(fig, title), source)


def chart_box(title: str, svg_text: str, source: str) -> str:
    return (f'<figure class="chart" data-chart="{esc(title)}">{svg_text}'
            f"<figcaption>{esc(source)}</figcaption></figure>")


def rejection_chart(run: dict) -> str:
    """Rejected designer attempts per regeneration, stacked by reason (designer/*.jsonl)."""
    steps = sorted(run["attempts"])
    failed = {s: [a for a in run["attempts"][s] if not a.get("ok")] for s in steps}
    reasons = sorted({str(a.get("reason")) for s in steps for a in failed[s]})
    stacks = {r: [float(sum(str(a.get("reason")) == r for a in failed[s])) for s in steps]
              for r in reasons}
    if not steps:  # no designer logs: the metrics' designer/rejected/<kind> counts
        rows = [r for r in run["rows"] if any("/rejected/" in k for k in r)]
        steps = [int(num(r.get("charts/step")) or 0) for r in rows]
        kinds = sorted({k for r in rows for k in r if "/rejected/" in k})
        stacks = {k.rsplit("/", 1)[-1]: [num(r.get(k)) or 0.0 for r in rows] for k in kinds}
    return bar_chart("Rejected designer attempts by reason", steps, stacks,
                     "designer/step-*.jsonl: reason of each attempt that failed")


def composition_chart(run: dict) -> str:
    """The pool at each regeneration by origin (envs/*/pool.json over all ranks)."""
    steps = sorted(run["pools"])
    origins = ["designer", "carried", "fallback", "fixed"]
    stacks = {o: [float(sum(e.get("origin") == o for e in run["pools"][s])) for s in steps]
              for o in origins}
    stacks = {o: v for o, v in stacks.items() if any(v)}
    return bar_chart("Pool composition at each regeneration", steps, stacks,
                     "envs/step-*/pool.json: origin of each environment")


TELEMETRY = [  # telemetry.py and grpo.py's mismatch/*: one chart per question
    ("Tokens/s per rank", [("generation", "perf/generate_tokens_per_s"),
                           ("update", "perf/update_tokens_per_s"),
                           ("whole step", "perf/step_tokens_per_s")], None),
    ("Weight sync and engine sleep / wake (s)", [("sync", "time/sync_s"), ("sleep", "time/sleep_s"),
                                                 ("wake", "time/wake_s")], None),
    ("Rollout / trainer mismatch", [("mean |d log p|", "mismatch/logp_abs_diff"),
                                    ("k3", "mismatch/k3"),
                                    ("TIS capped", "losses/is_weight_capped_frac")], None),
]


def telemetry_section(run: dict) -> str:
    """Step telemetry: rates, sync seconds, the mismatch, and the update's mean MFU."""
    mfu = [v for v in (num(r.get("perf/mfu")) for r in run["rows"]) if v is not None]
    line = (f'update MFU, mean over {len(mfu)} steps: <span data-field="mfu">'
            f"{fmt(sum(mfu) / len(mfu))}</span>" if mfu else "no perf/mfu (no known device peak)")
    charts = "".join(line_chart(run["rows"], t, lines, ylim) for t, lines, ylim in TELEMETRY
                     if any(find_key(run["rows"], k) for _, k in lines))  # older runs: none
    return (f'<section id="telemetry"><h2>Step telemetry</h2><p>{line}</p>'
            f'<div class="charts">{charts}</div></section>')


EVAL_COUNTS = ("items", "episodes", "scorer_errors")  # eval.py's counts beside its scores


def eval_chart(rows: list[dict], suite: str, keys: list[str], best: int | None) -> str:
    """One suite's eval/<suite>/<metric> curves; each metric's step-0 value (the untrained
    model's) dashed across the panel, the best step a dotted vertical line."""
    title = f"Held-out: {suite}"
    fig, ax = new_axes(title)
    steps, values = [], []
    for key in keys:
        xs, ys = series(rows, key)
        line, = ax.plot(xs, ys, marker="o" if len(xs) < 40 else None, markersize=3,
                        linewidth=1.2, label=key.split("/", 2)[2])
        if 0 in xs:
            ax.axhline(ys[xs.index(0)], linestyle="--", linewidth=1.0, color=line.get_color(),
                       label="untrained" if len(keys) == 1 else None)
        steps, values = steps + xs, values + ys
    if best is not None:
        ax.axvline(best, linestyle=":", linewidth=1.0, color="0.3", label=f"best: step {best}")
    fit_axes(ax, steps, values)
    legend(ax)
    return chart_box(title, svg(fig, title), f"metrics.jsonl: {', '.join(keys)}; dashed: step 0")


def eval_section(run: dict) -> str:
    """The held-out suites over training (--eval_every; eval/<suite>/<metric>), one panel per
    suite, and the best step of eval/checkpoints.json (eval.py's sweep summary). Empty for a run
    that evaluated nothing."""
    rows = run["rows"]
    keys = sorted({k for r in rows for k in r if k.startswith("eval/") and k.count("/") >= 2
                   and num(r[k]) is not None and not k.endswith(EVAL_COUNTS)})
    if not keys:
        return ""
    summary = rundir.read_json(run["dir"] / "eval" / "checkpoints.json", run["notes"], {})
    best = next((r for r in listof(summary.get("rows") if isinstance(summary, dict) else None)
                 if isinstance(r, dict) and r.get("checkpoint") == summary.get("best")), None)
    step = int(best["step"]) if best and num(best.get("step")) is not None else None
    line = ("no eval/checkpoints.json: no best step named" if step is None else
            f'best step: <span data-field="eval_best">{step}</span> (mean of '
            f'{esc(best.get("cells"))} Table-1 cells: {fmt(best.get("Avg"))}; '
            f"eval/checkpoints.md, as <code>eval.py --checkpoints</code> names the best export)")
    suites = sorted({k.split("/")[1] for k in keys})
    charts = "".join(eval_chart(rows, s, [k for k in keys if k.split("/")[1] == s], step)
                     for s in suites)
    return (f'<section id="heldout"><h2>Held-out evaluation</h2><p>{line}</p>'
            f'<div class="charts">{charts}</div></section>')


def curves_section(run: dict) -> str:
    rows = run["rows"]
    charts = [line_chart(rows, t, lines, ylim) for t, lines, ylim in CURVES]
    charts += [rejection_chart(run), composition_chart(run)]
    return (f'<section id="curves"><h2>Curves</h2><div class="charts">{"".join(charts)}</div>'
            "</section>")


# ----------------------------------------------------------------------------------------------
# Environment cards and transcripts.

def highlight(source: str, max_lines: int) -> str:
    """Python source as highlighted HTML. Only keywords, strings, comments and the names a class
    or function defines get a colour, one per kind: a span per token would make the code the
    page's bulk (2.6x the source's size instead of 1.6x)."""
    from pygments import format as pyg_format
    from pygments import lex
    from pygments.formatters import HtmlFormatter
    from pygments.lexers import PythonLexer
    from pygments.token import Comment, Keyword, Name, String, Token
    lines = source.splitlines()
    shown = "\n".join(lines[:max_lines])
    kinds = (Keyword, String, Comment, Name.Function, Name.Class, Name.Decorator)
    toks = list(lex(shown, PythonLexer()))
    kind_of = {t: next((k for k in kinds if t in k), Token.Text) for t in {t for t, _ in toks}}
    toks = [(kind_of[t], v) for t, v in toks]
    body = pyg_format(toks, HtmlFormatter(nowrap=True))
    note = (f'<p class="note">{len(lines) - max_lines} more lines not shown (--source_lines '
            f"{max_lines}).</p>" if len(lines) > max_lines else "")
    return f'<pre class="code">{body}</pre>{note}'


def mark_action(text: str, action) -> str:
    """Escaped reply text with the last occurrence of the parsed action highlighted."""
    i = text.rfind(action) if isinstance(action, str) and action else -1
    if i < 0:
        return esc(text)
    return f'{esc(text[:i])}<mark class="action">{esc(action)}</mark>{esc(text[i + len(action):])}'


def transcript_html(t: dict, tid: str, limit: int) -> str:
    """One play as chat turns: observations and replies in their own colours, the parsed action
    highlighted, an environment error in its own colour; cut at `limit` characters."""
    msgs = [m for m in listof(t.get("messages")) if isinstance(m, dict)]
    actions = [a if isinstance(a, str) else json.dumps(a) for a in listof(t.get("actions"))]
    head = (f"step {esc(t.get('step'))} · seed {esc(t.get('seed'))} · "
            f"{'hinted' if t.get('hinted') else 'unhinted'} · return "
            f"<span data-field=\"return\">{fmt(t.get('return'))}</span> · "
            f"status {esc(t.get('status'))}")
    out, budget, n_reply = [], limit, 0
    if t.get("rendered_prompt"):  # what the agent read first: system message, tools, observation
        shown, _ = cut(t["rendered_prompt"], max(200, limit))
        out.append('<details class="prompt"><summary>first prompt as the agent read it (chat '
                   f'template, system message, tools)</summary><pre>{esc(shown)}</pre></details>')
    for i, m in enumerate(msgs):
        if budget <= 0:
            out.append(f'<p class="note">{len(msgs) - i} more message(s) not shown '
                       f"(--transcript_chars {limit}; the whole play is in transcripts/"
                       f"step-{int(t.get('step') or 0):04d}-rank-*.jsonl).</p>")
            break
        text, _ = cut(m.get("content"), max(200, budget))
        budget -= len(text)
        if m.get("role") == "assistant":
            action = actions[n_reply] if n_reply < len(actions) else None
            n_reply += 1
            act = f'<div class="act">action: <code>{esc(action)}</code></div>' if action else ""
            out.append(f'<div class="turn reply"><span class="role">agent</span>'
                       f"<pre>{mark_action(text, action)}</pre>{act}</div>")
        else:
            role = "environment" if m.get("role") in ("user", "tool") else esc(m.get("role"))
            out.append(f'<div class="turn obs"><span class="role">{role}</span>'
                       f"<pre>{esc(text)}</pre></div>")
    if t.get("error") or t.get("status") == "env_error":
        out.append(f'<div class="turn err"><span class="role">environment error</span>'
                   f"<pre>{esc(cut(t.get('error'), TEXT_CHARS)[0])}</pre></div>")
    return f'<div class="transcript" id="{tid}"><h4>{head}</h4>{"".join(out)}</div>'


def pick_transcripts(at: list[dict]) -> list[dict]:
    """Up to two plays of an environment: unhinted and hinted alternately."""
    plain = [t for t in at if not t.get("hinted")]
    hinted = [t for t in at if t.get("hinted")]
    return [t for pair in zip_longest(plain, hinted) for t in pair if t][:2]


def memory_line(run: dict, env: dict, win_rate) -> str:
    if env.get("origin") != "designer":
        return "none (only designer-written environments enter memory)"
    if run["config"].get("no_memory"):
        return "none (--no_memory)"
    for r in run["memory"]:
        if r.get("step") == env["step"] and r.get("source") == env.get("source"):
            return (f"win rate <span data-field=\"memory_win_rate\">{fmt(r.get('win_rate'))}"
                    f"</span>, regret {fmt(r.get('regret'))} (in memory.json now)")
    return (f"win rate {fmt(win_rate)}, regret {fmt(env.get('regret'))} when entered; no longer in "
            "memory.json (evicted, or faulted before it could enter)")


def card_html(run: dict, env: dict, cid: str, opts: dict, logged: list[dict]) -> str:
    """One environment card (Figure 2): skill, document, first observation, code, hint, returns."""
    rets = [v for v in (num(x) for x in listof(env.get("returns"))) if v is not None]
    r_nohint = env.get("r_nohint") if num(env.get("r_nohint")) is not None else (
        sum(rets) / len(rets) if rets else None)
    win = metrics.win_rate(rets) if rets else None
    rundir.read_source(env, run["notes"])
    att = rundir.attempt_of(run, env)
    plays = pick_transcripts(logged)
    first = next((p for p in plays if not p.get("hinted")), plays[0] if plays else None)
    msgs = [m for m in listof(first.get("messages")) if isinstance(m, dict)] if first else []
    obs = msgs[0].get("content") if msgs else None
    score = run["scores"].get(str(env.get("env_id")))
    no_doc = "none (--no_corpus)" if run["config"].get("no_corpus") else "n/a"
    doc = (f'<span data-field="doc_title">{esc(att.get("doc_title") or att.get("doc_id"))}</span> '
           f'<small class="note">(id {esc(att.get("doc_id"))})</small>'
           if att.get("doc_id") else no_doc)
    fields = [("skill", esc(env.get("skill"))), ("origin", esc(env.get("origin"))),
              ("document", doc), ("attempt", esc(att.get("attempt", "n/a"))
                                       + (" (brace-repaired)" if att.get("repaired") else "")),
              ("unhinted return", f'<span data-field="r_nohint">{fmt(r_nohint)}</span>'
                                  f" (win rate {fmt(win)}, {len(rets)} plays)"),
              ("hinted return", f'<span data-field="r_hint">{fmt(env.get("r_hint"))}</span>'),
              ("regret", f'<span data-field="regret">{fmt(env.get("regret"))}</span>'),
              ("designer score", f'<span data-field="score">{fmt(score)}</span>'),
              ("memory", memory_line(run, env, win))]
    dl = "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in fields)
    links = " ".join(f'<a href="#{cid}-t{j}">{"hinted" if p.get("hinted") else "unhinted"} play</a>'
                     for j, p in enumerate(plays)) or "no transcript logged"
    obs_html = (f"<pre>{esc(cut(obs, TEXT_CHARS)[0])}</pre>" if obs is not None
                else '<p class="note">no unhinted transcript of this environment was logged</p>')
    code = (highlight(env["source"], opts["source_lines"]) if env.get("source") is not None
            else '<p class="note">source file missing</p>')
    hint = env.get("hint")
    hint_html = (f"<pre>{esc(cut(hint, TEXT_CHARS)[0])}</pre>" if hint
                 else '<p class="note">no hint</p>')
    plays_html = "".join(transcript_html(p, f"{cid}-t{j}", opts["transcript_chars"])
                         for j, p in enumerate(plays))
    return (f'<article class="card" id="{cid}" data-env="{esc(env.get("env_id"))}" '
            f'data-step="{env["step"]}">'
            f'<h3>{esc(env.get("class_name") or "?")} <small>{esc(env.get("env_id"))}</small></h3>'
            f'<div class="cols"><div><dl>{dl}</dl><p>Transcripts: {links}</p>'
            f"<h4>First observation</h4>{obs_html}<h4>Hint</h4>{hint_html}</div>"
            f"<div><h4>Source</h4>{code}</div></div>"
            f'<details class="plays"{" open" if plays else ""}><summary>Transcripts</summary>'
            f"{plays_html}</details></article>")


def order_key(env: dict):
    """Designer-written first, then by regret (highest first), then as logged."""
    rank = {"designer": 0, "fixed": 1, "fallback": 2, "carried": 3}.get(str(env.get("origin")), 4)
    reg = num(env.get("regret"))
    return (rank, -(reg if reg is not None else -math.inf))


def cards_section(run: dict, opts: dict) -> str:
    steps = sorted(run["pools"], reverse=True)
    if not steps:
        return ('<section id="cards"><h2>Environments</h2><p class="note">no envs/ pools logged '
                'yet</p></section>')
    toc = " · ".join(f'<a href="#regen-{s}">step {s}</a>' for s in steps)
    parts = [f'<section id="cards"><h2>Environments, newest regeneration first</h2><p>{toc}</p>']
    for s in steps:
        pool = sorted(run["pools"][s], key=order_key)
        shown = pool[: opts["cards"]]
        counts = ", ".join(f"{sum(e.get('origin') == o for e in pool)} {o}"
                           for o in sorted({str(e.get("origin")) for e in pool}))
        more = (f' <span class="note">{len(pool) - len(shown)} more not shown '
                f'(--cards {opts["cards"]}):'
                f' {esc(", ".join(str(e.get("env_id")) for e in pool[len(shown):]))}</span>'
                if len(pool) > len(shown) else "")
        logged = rundir.read_transcripts(run, s, {str(e.get("env_id")) for e in shown})
        cards = "".join(guarded(f"card {e.get('env_id')}", card_html, run, e, f"card-{s}-{i}", opts,
                                logged.get(str(e.get("env_id")), []))
                        for i, e in enumerate(shown))
        parts.append(f'<section class="regen" id="regen-{s}"><h2>Regeneration at step {s}</h2>'
                     f"<p>Pool of {len(pool)}: {esc(counts)}.{more}</p>{cards}</section>")
    return "".join(parts) + "</section>"


# ----------------------------------------------------------------------------------------------
# Header, designer section, page.

def header_section(run: dict) -> str:
    cfg, rows = run["config"], run["rows"]
    # a step's rows, not the held-out evaluation's own row after the last step (--eval_every)
    ran = [r for r in rows if any(not k.startswith(("eval/", "time/eval_s", "charts/step"))
                                  for k in r)]
    steps_done = len({num(r.get("charts/step")) if num(r.get("charts/step")) is not None else -1 - i
                      for i, r in enumerate(ran)})
    total = cfg.get("steps")
    level = next((r["sandbox/level"] for r in reversed(rows)
                  if isinstance(r.get("sandbox/level"), str)), "n/a")
    t = {k: sum(v for v in (num(r.get(f"time/{k}_s")) for r in rows) if v is not None)
         for k in ("step", *metrics.PHASES)}
    other = t["step"] - sum(t[k] for k in metrics.PHASES)  # the log phase: files, checkpoints
    split = " · ".join(f'{k} <span data-field="time_{k}">{fmt(t[k], 1)}</span> s'
                       for k in metrics.PHASES) + f" · log {fmt(other, 1)} s"
    status = ("finished" if isinstance(total, int) and steps_done >= total
              else "in progress, or stopped before its end")
    facts = [("model", esc(cfg.get("model", "n/a"))), ("setting", esc(cfg.get("setting", "n/a"))),
             ("sandbox level", esc(level)),
             ("steps done", f'<span data-field="steps_done">{steps_done}</span> of '
                            f'{esc(total or "?")} ({status})'),
             ("wall time", f'<span data-field="time_step">{fmt(t["step"], 1)}</span> s: {split}')]
    dl = "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in facts)
    conf = "".join(f"<tr><td>{esc(k)}</td><td>{esc(json.dumps(v))}</td></tr>"
                   for k, v in sorted(cfg.items()))
    notes = "".join(f"<li>{esc(n)}</li>" for n in run["notes"])
    missing = (f'<div class="notes"><h3>Not in this report</h3><ul>{notes}</ul></div>' if notes
               else "")
    return (f'<header id="header"><h1>SPADE run: {esc(run["dir"].name)}</h1>'
            f'<dl class="facts">{dl}</dl>'
            f"<details><summary>Resolved configuration ({len(cfg)} fields, config.json)</summary>"
            f'<table class="config">{conf}</table></details>{missing}</header>')


def designer_section(run: dict) -> str:
    """Attempts per regeneration, each rejection reason with one example, the repaired designs."""
    att = run["attempts"]
    rows = "".join(
        f"<tr><td>{s}</td><td>{len(a)}</td><td>{sum(bool(x.get('ok')) for x in a)}</td>"
        f"<td>{sum(bool(x.get('ok')) and x.get('attempt') == 1 for x in a)}</td>"
        f"<td>{sum(bool(x.get('ok') and x.get('repaired')) for x in a)}</td></tr>"
        for s, a in sorted(att.items()))
    table = ("<table><tr><th>step</th><th>attempts</th><th>valid</th>"
             f"<th>valid at first attempt</th><th>repaired</th></tr>{rows}</table>" if att
             else '<p class="note">no designer/ logs</p>')
    examples = {}
    for s, a in sorted(att.items(), reverse=True):
        for x in a:
            if not x.get("ok"):
                examples.setdefault(str(x.get("reason")), []).append(dict(x, step=s))
    reasons = "".join(
        f'<div class="reason" data-reason="{esc(r)}"><h4>{esc(r)}: {len(xs)} attempt(s)</h4>'
        f"<p>example: step {xs[0]['step']}, {esc(xs[0].get('skill'))}, "
        f"attempt {esc(xs[0].get('attempt'))}"
        f"{', reply cut at the token limit' if xs[0].get('finish_reason') == 'length' else ''}</p>"
        f"<pre>{esc(cut(xs[0].get('error'), TEXT_CHARS)[0])}</pre>"
        + ("<details><summary>its code</summary>"
           f"<pre>{esc(cut(xs[0]['source'], TEXT_CHARS)[0])}</pre></details>"
           if xs[0].get("source") else "") + "</div>"
        for r, xs in sorted(examples.items(), key=lambda kv: -len(kv[1])))
    repaired = [dict(x, step=s) for s, a in att.items() for x in a
                if x.get("ok") and x.get("repaired")]
    rep = "".join(f"<li>step {x['step']}: {esc(x.get('class_name'))} ({esc(x.get('skill'))})</li>"
                  for x in repaired) or "<li>none</li>"
    return (f'<section id="designer"><h2>Designer</h2>{table}'
            "<h3>Rejection reasons, one example each</h3>"
            f'{reasons or "<p>no rejected attempts</p>"}<h3>Repaired designs (f-string braces)</h3>'
            f"<ul>{rep}</ul></section>")


CSS = """
body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',sans-serif;color:#1d1d1f;margin:0 auto;
max-width:1200px;padding:16px}
h1{font-size:22px}h2{font-size:18px;border-bottom:1px solid #ddd;padding-bottom:4px}
h3{font-size:15px}h4{font-size:13px;margin:10px 0 4px}
dl{display:grid;grid-template-columns:max-content 1fr;gap:2px 12px;margin:0}
dt{color:#666}dd{margin:0}
pre{white-space:pre-wrap;word-break:break-word;background:#f6f6f8;padding:6px 8px;
border-radius:4px;margin:2px 0;font-size:12px}
.charts{display:grid;grid-template-columns:repeat(auto-fill,minmax(380px,1fr));gap:12px}
.chart{margin:0;border:1px solid #e3e3e3;border-radius:6px;padding:6px}
.chart svg{width:100%;height:auto}
figcaption,.note{color:#777;font-size:12px}
.card{border:1px solid #ccc;border-radius:8px;padding:10px 14px;margin:14px 0;background:#fff}
.card h3 small{color:#777;font-weight:normal}
.cols{display:grid;grid-template-columns:minmax(0,2fr) minmax(0,3fr);gap:16px}
.code{background:#fbfbfd;border:1px solid #eee;max-height:520px;overflow:auto}
.turn{border-left:4px solid #bbb;padding-left:8px;margin:6px 0}
.role{font-size:11px;text-transform:uppercase;color:#666}
.obs{border-color:#7a9cc6}.obs pre{background:#eef3fa}
.reply{border-color:#6aa56a}.reply pre{background:#eff7ef}
.err{border-color:#c0392b}.err pre{background:#fbeaea;color:#8e1b10}
mark.action{background:#ffe066;font-weight:bold}.act{font-size:12px}
table{border-collapse:collapse;font-size:12px}
td,th{border:1px solid #ddd;padding:2px 6px;text-align:left}
.notes{border:1px solid #e0b400;background:#fffaf0;
padding:4px 12px;border-radius:6px;margin-top:8px}
details summary{cursor:pointer;color:#2255aa}
@media print{.regen{break-before:page}.card{break-inside:avoid}
.code{max-height:none;overflow:visible}}
"""


def guarded(title: str, draw, *args) -> str:
    """A part of the page, or a note of why it could not be drawn: one file this report did not
    expect (hand-edited, from another version) costs that part, never the page."""
    try:
        return draw(*args)
    except Exception as e:  # any failure becomes a note on the page
        return (f'<div class="notes"><h3>{esc(title)}</h3><p>could not be drawn from this '
                f"run's files ({esc(type(e).__name__)}: {esc(cut(e, 300)[0])})</p></div>")


def render(run_dir, *, cards: int = CARDS, source_lines: int = SOURCE_LINES,
           transcript_chars: int = TRANSCRIPT_CHARS) -> str:
    """The whole page as a string."""
    from pygments.formatters import HtmlFormatter
    run = rundir.load_run(Path(run_dir))
    opts = {"cards": cards, "source_lines": source_lines, "transcript_chars": transcript_chars}
    body = (guarded("Curves", curves_section, run) + guarded("Held-out", eval_section, run)
            + guarded("Telemetry", telemetry_section, run)
            + guarded("Environments", cards_section, run, opts)
            + guarded("Designer", designer_section, run))
    body = guarded("Header", header_section, run) + body  # last: the sections above add notes
    css = CSS + HtmlFormatter(style="default").get_style_defs(".code")
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width,initial-scale=1">'
            f"<title>SPADE run {esc(run['dir'].name)}</title><style>{css}</style></head>"
            f"<body>{body}</body></html>")


def write_report(run_dir, out=None, **opts) -> Path:
    """Render and write atomically (a reader never sees half a page); returns the file."""
    out = Path(out) if out else Path(run_dir) / "report.html"
    text = render(run_dir, **opts)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8", errors="replace")  # a lone surrogate from a model
    os.replace(tmp, out)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description="One self-contained HTML page of a SPADE run directory.")
    ap.add_argument("run_dir", help="the run directory (train.py --output_dir)")
    ap.add_argument("--out", help="output file (default RUN_DIR/report.html)")
    ap.add_argument("--cards", type=int, default=CARDS, help="environment cards per regeneration")
    ap.add_argument("--source_lines", type=int, default=SOURCE_LINES, help="source lines per card")
    ap.add_argument("--transcript_chars", type=int, default=TRANSCRIPT_CHARS,
                    help="characters shown of each transcript")
    a = ap.parse_args(argv)
    try:
        out = write_report(a.run_dir, a.out, cards=a.cards, source_lines=a.source_lines,
                           transcript_chars=a.transcript_chars)
    except rundir.NotARun as e:
        print(f"report.py: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # the page cannot be written where --out points
        print(f"report.py: cannot write {a.out or a.run_dir}: {e.strerror or e}", file=sys.stderr)
        return 2
    print(f"wrote {out} ({out.stat().st_size / 1e6:.2f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
