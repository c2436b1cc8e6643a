"""bench/designer_learns.py: the world in which the designer can learn, and the direction it learns.

The fast tests pin the experiment's reading of a run: the shipped family is what its docstring
says (every dial validates in the sandbox, reads back, pays what `wins` says, and shows the same
first observation), a family that leaks its dial is refused, and the frontier and the verdict are
hand-computed. The slow test runs the real loop (train.main, unchanged) twice from one small warm
start, SPADE and the control --no_designer_training, and checks the one thing no other test can:
that the designer's GRPO update goes the policy gradient's way on environments a model wrote
itself. The sources that scored above their regeneration's mean must gain probability under SPADE
(a sign error in the designer's advantage, designer samples trained on the wrong tokens or a score
that never reaches the loss would fail it), more than the control's weights, which only the
agent's updates move, let them.
"""
import random
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import designer_learns as dl  # noqa: E402
import sandbox  # noqa: E402

FAMILY = dl.load_family(dl.FAMILY)


def test_the_concise_family_is_what_it_says():
    with sandbox.Sandbox(workers=1) as sb:
        observation = dl.check_family(FAMILY, sb)
    assert observation == "Say your move in the box. Fewer words score."
    assert FAMILY.DIALS == (8, 7, 6, 5, 4, 3, 2, 1, 0)
    for dial in FAMILY.DIALS:
        assert FAMILY.dial_of(FAMILY.environment(dial)) == dial
    rng = random.Random(0)
    drawn = [FAMILY.dial_of(FAMILY.designer_source(rng)) for _ in range(200)]
    assert set(drawn) <= set(FAMILY.DIALS) and 3.5 < sum(drawn) / len(drawn) < 4.5  # Bin(8, 1/2)
    # a list a slot short or long still sets its sum, as step() sums it; a foreign item none
    assert FAMILY.dial_of(FAMILY.with_plan([1, 0, 1])) == 2
    assert FAMILY.dial_of(FAMILY.with_plan([1] * 5 + [0] * 4)) == 5
    assert FAMILY.dial_of(FAMILY.with_plan([2, 1, 1, 0])) == 4
    assert FAMILY.dial_of(FAMILY.with_plan([1, "x", 0])) is None
    assert FAMILY.dial_of(FAMILY.with_plan([1] * 9)) is None  # L = 9: past the family
    assert FAMILY.dial_of("class E:\n    pass\n") is None
    assert FAMILY.wins("\\boxed{up up}", 2) and not FAMILY.wins("\\boxed{up up}", 1)
    assert not FAMILY.wins("\\boxed{}", 8) and not FAMILY.wins("up", 8)
    assert not FAMILY.wins("\\boxed{up}", 0)  # L = 0: nothing wins
    assert [FAMILY.difficulty(d) for d in (8, 4, 0)] == [1, 5, 9]


def test_a_family_whose_first_observation_shows_the_dial_is_refused():
    leaky = types.SimpleNamespace(**{k: getattr(FAMILY, k) for k in dir(FAMILY)
                                     if not k.startswith("__")})
    leaky.environment = lambda dial: FAMILY.environment(dial).replace(
        "Fewer words score.", f"At most {dial} words.")
    leaky.dial_of = lambda source: int(source.split("At most ")[1].split()[0])
    with sandbox.Sandbox(workers=1) as sb, pytest.raises(SystemExit, match="depends on the dial"):
        dl.check_family(leaky, sb)


def test_a_family_file_that_lacks_a_name_is_refused(tmp_path):
    path = tmp_path / "half.py"
    path.write_text("NAME = 'half'\nDIALS = (1, 0)\n")
    with pytest.raises(SystemExit, match="lacks HINT, designer_source"):
        dl.load_family(path)
    with pytest.raises(SystemExit, match="no such file"):
        dl.load_family(tmp_path / "none.py")


def test_the_frontier_is_where_the_win_rate_crosses_one_half():
    curve = {d: 0.0 for d in FAMILY.DIALS}
    curve.update({8: 1.0, 7: 0.8, 6: 0.4})  # difficulties 1, 2, 3
    assert dl.frontier(curve, FAMILY) == pytest.approx(2 + 0.3 / 0.4)  # 2.75, linear
    assert dl.frontier({d: 0.3 for d in FAMILY.DIALS}, FAMILY) == 0.5  # even L = 8 is lost
    assert dl.frontier({d: 0.9 for d in FAMILY.DIALS}, FAMILY) == 9.5  # even L = 0 is won


def epoch(step, share, distance, accepted, attempts, regret):
    return {"step": step, "learnable_slot_share": share, "distance": distance,
            "accepted": accepted, "attempts": attempts, "regret_mean": regret,
            "regret_positive_share": 1.0, "frontier": 3.0}


def test_the_summary_and_the_verdict_by_hand():
    spade = dl.summarise([epoch(0, 0.0, 2.0, 8, 8, 0.5), epoch(2, 0.5, 1.0, 7, 8, 0.3),
                          epoch(4, 0.75, 0.0, 8, 8, 0.1)], steps=6)
    assert spade["learnable_second_half"] == 0.75       # only the epoch at step 4 >= 6 / 2
    assert spade["distance"] == 1.0 and spade["validity"] == 23 / 24
    assert spade["regret_mean"] == pytest.approx(0.3)
    control = dl.summarise([epoch(0, 0.0, 2.0, 8, 8, 0.5), epoch(2, 0.25, 2.0, 8, 8, 0.5),
                            epoch(4, 0.25, 2.0, 6, 8, 0.5)], steps=6)
    update = {"spade": {"cov": 0.02}, "control": {"cov": 0.001}}
    results = {0: {"spade": {**spade, "update": update["spade"]},
                   "control": {**control, "update": update["control"]}}}
    holds, lines = dl.verdict(results)
    assert holds and len(lines) == 5 and all(line.startswith("PASS") for line in lines)
    assert "mean +0.500" in lines[0]                    # 0.75 - 0.25
    results[0]["spade"]["update"] = {"cov": -0.02}      # the update against its own scores
    holds, lines = dl.verdict(results)
    assert not holds and lines[4].startswith("FAIL") and "SPADE -0.020" in lines[4]


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_the_designer_update_follows_its_scores(tmp_path):
    """A 2-layer warm start, then 6 steps of each arm from it: 3 regenerations, 2 designer
    updates under SPADE. 141 s in a full suite on 2 cores; 13.5 minutes beside two other jobs
    (load 4)."""
    warm = dl.WarmUp(hidden=64, layers=2, intermediate=192, steps=150)
    args = dl.parse_args(["--steps", "6", "--work", str(tmp_path)])
    with sandbox.Sandbox(workers=2) as sb:
        start = dl.warm_up(FAMILY, tmp_path, warm, seed=0, sb=sb)
        runs = {arm: dl.run_arm(start, arm, 0, tmp_path / arm, args)
                for arm in ("spade", "control")}
        found = {arm: dl.analyse(run, FAMILY, args.regen_interval, args.num_envs)
                 for arm, run in runs.items()}
        update = {arm: dl.update_direction(run, start, FAMILY, sb, seed=0,
                                           regen_interval=args.regen_interval)
                  for arm, run in runs.items()}
    # this small start writes about 4 accepted environments in 10 (the bench's, 4 layers of 128,
    # about 10 in 10): enough scored designs to see the update's direction, both arms alike
    for arm in runs:
        assert found[arm]["validity"] > 0.2 and update[arm]["n"] >= 8, (arm, found, update)
    # the recomputed scores are the loop's own (what update_direction centres)
    assert update["spade"]["score_gap"] is not None and update["spade"]["score_gap"] < 1e-9
    assert update["spade"]["cov"] > 0, update
    assert update["spade"]["cov"] > update["control"]["cov"], update
