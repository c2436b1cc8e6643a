"""The paper's recipe as the authors ran it: per-model presets against their launchers
(github spade-rl/spade, cmd/), explicit flags winning, --print_config, the log-prob temperature."""
import json

import dataclasses

import pytest

from infra import config
from infra import baseline as pools
import train
from scripted import main_with

# Written out from the launchers, one literal per value (not derived from config.PRESETS).
GAMES = {"steps": 400, "regen_interval": 4, "num_envs": 24, "plays": 8, "hint_plays": 16,
         "skills_per_regen": 3, "designer_max_tokens": 16384, "hint_max_tokens": 4096,
         "max_turns": 25, "max_context": 32768, "max_new_tokens": 8192, "designer_reward": "blend",
         "kl_coef": 0.0, "logprob_temperature": 1.0, "agent_temperature": 0.6,
         "designer_temperature": 0.6, "hint_temperature": 0.3, "top_p": 0.95, "top_k": 20,
         "corpus_seed": 42,
         "memory_capacity": 200, "lr": 1e-6, "weight_decay": 0.1, "clip_low": 0.2, "clip_high": 0.28,
         "checkpoint_every": 16}
LAUNCHERS = {
    # cmd/games/train_spade_4b.sh: batch 192 over 24 games, --rollout-temperature 1.0, KL 0.00
    ("Qwen3-4B", "games"): GAMES,
    # cmd/games/train_spade_8b.sh: --spade-env-max-tokens 20000, KL 0.005, thinking agent with
    # per-turn samples; designer, hint and hinted plays rendered with the adapter's
    # enable_thinking false
    ("Qwen3-8B", "games"): dict(GAMES, designer_max_tokens=20000, kl_coef=0.005,
                                designer_thinking=False, hint_thinking=False, enable_thinking=True,
                                strip_thinking_history=True, hinted_thinking=False),
    # cmd/games/train_spade_30b.sh: as 4B, chat template kwargs enable_thinking false
    ("Qwen3-30B-A3B", "games"): dict(GAMES, designer_thinking=False, hint_thinking=False,
                                     enable_thinking=False),
    # cmd/tool_use/train_spade_4b.sh: 500 rollouts, 16 games, batch 256, regen/delay 32,
    # regret_based, hint 512 tokens x 4 plays, KL 0.005, --rollout-temperature 0.7
    ("Qwen3-4B", "tool"): dict(GAMES, steps=500, regen_interval=32, num_envs=16, plays=16,
                               hint_plays=4, skills_per_regen=6, hint_max_tokens=512,
                               designer_reward="regret", kl_coef=0.005, logprob_temperature=0.7),
    # cmd/tool_use/_train_spade_blend.sh with TOOL_MODEL_SIZE=8b: regen 8, hint 2048, 20000 tokens;
    # the tool path (orchestrator.py dispatches it before the thinking path) keeps one accumulated
    # sequence per episode, earlier <think> blocks included, hinted plays as the others
    ("Qwen3-8B", "tool"): dict(GAMES, regen_interval=8, skills_per_regen=6, hint_max_tokens=2048,
                               kl_coef=0.005, designer_max_tokens=20000, designer_thinking=False,
                               hint_thinking=False, enable_thinking=True,
                               strip_thinking_history=False, hinted_thinking=None),
    # ... with TOOL_MODEL_SIZE=30b: 16384 tokens, thinking off
    ("Qwen3-30B-A3B", "tool"): dict(GAMES, regen_interval=8, skills_per_regen=6,
                                    hint_max_tokens=2048, kl_coef=0.005, designer_thinking=False,
                                    hint_thinking=False, enable_thinking=False),
}


def printed(capsys, *flags) -> dict:
    assert train.main([*flags, "--print_config"]) is None
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("model,setting", sorted(LAUNCHERS))
def test_preset_matches_the_authors_launcher(capsys, model, setting):
    cfg = printed(capsys, "--model", model, "--setting", setting)
    expected = LAUNCHERS[(model, setting)]
    assert {k: cfg[k] for k in expected} == expected
    fields = {f.name for cls in config.GROUPS for f in dataclasses.fields(cls)}
    assert set(cfg) == fields  # every field, by its dataclass name


def test_hub_id_selects_the_same_preset(capsys):
    assert printed(capsys, "--model", "Qwen/Qwen3-8B")["kl_coef"] == 0.005


@pytest.mark.parametrize("flags,key,value", [
    (["--kl_coef", "0"], "kl_coef", 0.0),
    (["--kl-coef=0.02"], "kl_coef", 0.02),
    (["--designer_max_tokens", "100"], "designer_max_tokens", 100),
    (["--designer_max", "100"], "designer_max_tokens", 100),  # an abbreviation is a flag too
    (["--designer-max=100"], "designer_max_tokens", 100),
    (["--strip_thinking", "false"], "strip_thinking_history", False),
    (["--enable_thinking", "false"], "enable_thinking", False),
    (["--no_memory"], "no_memory", True),
    (["--logprob_temperature", "0.6"], "logprob_temperature", 0.6),
])
def test_explicit_flags_win_over_the_preset(capsys, flags, key, value):
    cfg = printed(capsys, "--model", "Qwen3-8B", *flags)
    assert cfg[key] == value and cfg["designer_max_tokens" if key != "designer_max_tokens" else "kl_coef"] \
        == (20000 if key != "designer_max_tokens" else 0.005)


def test_models_without_a_preset_keep_the_paper_defaults(capsys):
    cfg = printed(capsys, "--model", "tiny")
    assert cfg["logprob_temperature"] is None and cfg["kl_coef"] == 0.0 and cfg["regen_interval"] == 4
    cfg = printed(capsys, "--model", "tiny", "--setting", "tool")
    assert cfg["kl_coef"] == 0.005 and cfg["regen_interval"] == 8 and cfg["hint_max_tokens"] == 2048


def test_logprob_temperature_must_be_positive():
    with pytest.raises(SystemExit, match="--logprob_temperature must be > 0"):
        train.main(["--model", "tiny", "--logprob_temperature", "0", "--print_config"])


def test_logprob_temperature_per_role():
    """Trained log-probs use --logprob_temperature; default: each role's sampling temperature."""
    cfg = config.Config(agent=config.AgentArgs(agent_temperature=0.6),
                        designer=config.DesignerArgs(designer_temperature=0.8))
    assert config.role_temperatures(cfg) == {"agent": 0.6, "designer": 0.8}
    cfg.grpo.logprob_temperature = 1.0
    assert config.role_temperatures(cfg) == {"agent": 1.0, "designer": 1.0}


def test_stripped_history_episode_trains_one_sample_per_turn():
    from types import SimpleNamespace as NS
    turns = [([1, 2, 3], [0, 0, 1], [0.0, 0.0, -0.5]), ([1, 4, 5, 6], [0, 0, 1, 1], [0.0, 0.0, -0.1, -0.2])]
    eps = [NS(env_id="e", ret=1.0, hinted=False, status="terminated", turn_samples=turns,
              token_ids=[1, 4, 5, 6], mask=[0, 0, 1, 1], logprobs=[0.0, 0.0, -0.1, -0.2]),
           NS(env_id="e", ret=0.0, hinted=False, status="terminated", turn_samples=[],
              token_ids=[7, 8], mask=[0, 1], logprobs=[0.0, -0.3])]
    out = train.agent_samples(eps)
    # advantages: returns (1, 0), mean 0.5, population std 0.5 -> +1 / -1 (Eq. 1)
    assert [s.token_ids for s in out] == [[1, 2, 3], [1, 4, 5, 6], [7, 8]]
    assert [s.advantage for s in out] == [pytest.approx(1.0), pytest.approx(1.0), pytest.approx(-1.0)]


def test_each_episode_weighs_one_in_the_loss_whatever_its_turns(monkeypatch):
    """Two episodes of one group, returns 1 and 0 (A = +1, -1): one of one turn, one stripped into
    three turn samples. With logp = theta * token id at theta = 0 every ratio and importance weight
    is 1, so d loss / d theta = mean over episodes of -A_e * (the token-mean of the episode's
    trained ids): its turns pool into one token-mean (the authors' group), each episode weighs 1/2.
        episode 1: ids 2, 3                      -> 2.5
        episode 2: ids 4 | 8, 8 | 2 (three turns) -> 22 / 4 = 5.5
        grad = (-(+1) * 2.5 - (-1) * 5.5) / 2 = 1.5;  one SGD step at lr 1: theta = -1.5
    (every turn sample weighing 1/4, the old mean, gives (-2.5 + 4 + 8 + 2) / 4 = 2.875)."""
    from infra import logprobs
    import torch
    from accelerate import Accelerator
    from types import SimpleNamespace as NS
    two = [([1, 4], [0, 1], [0.0] * 2), ([1, 6, 8, 8], [0, 0, 1, 1], [0.0] * 4),
           ([1, 6, 2], [0, 0, 1], [0.0] * 3)]
    eps = [NS(env_id="e", ret=1.0, hinted=False, status="terminated", turn_samples=[],
              token_ids=[1, 2, 3], mask=[0, 1, 1], logprobs=[0.0] * 3),
           NS(env_id="e", ret=0.0, hinted=False, status="terminated", turn_samples=two)]
    samples = train.agent_samples(eps)
    assert [s.weight for s in samples] == [1.0, 0.25, 0.5, 0.25]  # shares of 4 trained tokens

    class Theta(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.theta = torch.nn.Parameter(torch.zeros(()))
    monkeypatch.setattr(logprobs, "token_logprobs",
                        lambda model, ids, *a, **k: model.theta * ids.float())  # (B, T)
    model = Theta()
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
    out = train.grpo_update(train.Trainer(model, opt, sched, Accelerator(cpu=True)), samples,
                            pad_id=0, temperatures={"agent": 1.0},
                            gargs=config.GRPOArgs(kl_coef=0.0, grad_clip=100.0,
                                                  micro_batch_tokens=4))
    assert model.theta.item() == pytest.approx(-1.5)
    assert out["losses/samples"] == 2  # two episodes


def test_role_scale_counts_episodes_not_turn_samples():
    """S = min(50, N_agent / N_designer * R): 192 episodes of three turn samples each and 24
    designer samples at R = 4 give 192 / 24 * 4 = 32 (the 576 turn samples would hit the cap)."""
    from types import SimpleNamespace as NS
    turns = [([1, 2], [0, 1], [0.0, -0.1])] * 3
    eps = [NS(env_id=f"e{i % 24}", ret=float(i % 2), hinted=False, status="terminated",
              turn_samples=turns) for i in range(192)]
    agent = train.agent_samples(eps)
    env = train.PoolEnv("e", "s", "src", "XEnv", "designer")
    scored = [train.Design(env, [1], [2], [-0.5], score=i / 24) for i in range(24)]
    out, m = train.designer_samples(scored, agent, regen_interval=4)
    assert len(agent) == 576 and m["designer/scale"] == 32.0
    assert out[0].advantage == pytest.approx(32.0 * (0 - 23 / 48))  # S (score - mean_skill)


def test_play_pool_passes_the_hinted_arms_thinking(monkeypatch):
    """The 8B games preset's hinted_thinking=False reaches agent.play with the agent's switches."""
    from types import SimpleNamespace as NS
    seen = {}
    monkeypatch.setattr(train.agent, "play", lambda specs, **kw: seen.update(kw, n=len(specs)) or [])
    sb = NS(open=lambda src, setting: NS(close=lambda: None), step_many=None, reset_many=None)
    sampler = NS(stream=lambda step, role, sampling: None, drain=lambda: None)
    env = train.PoolEnv("a", "Math", "src", "AEnv", "designer", hint="Try 5.")
    aargs = config.parse(["--model", "Qwen3-8B"], {}).agent
    train.play_pool(0, [env], sampler, sb, None, aargs, config.LoopArgs(plays=2, hint_plays=3),
                    hinted_arm=True, seed=0)
    assert seen["n"] == 5 and (seen["enable_thinking"], seen["hinted_thinking"],
                               seen["strip_thinking_history"]) == (True, False, True)


# ----------------------------------------------------------------------------------------------
# designer-reward ablations, hand-computed


def test_regret_ablation_is_the_authors_regret_based():
    import regret
    # r_hint - mean of the whole epoch's unhinted plays, floored at 0, no /0.15 scaling
    assert regret.SCORES["regret"](r_hint=0.75, mean_return=0.25) == pytest.approx(0.5)
    assert regret.SCORES["regret"](r_hint=0.2, mean_return=0.5) == 0.0
    assert regret.fault_score("regret", timed_out=True) == -0.5


def test_learning_potential_trackers_and_score():
    import regret
    mu = regret.learning_potential_update(None, 0.5)
    assert mu == [0.5, 0.5]
    mu = regret.learning_potential_update(mu, 1.0)  # 0.02 * 0.5 + 0.98 * 1, 0.15 * 0.5 + 0.85 * 1
    assert mu == [pytest.approx(0.99), pytest.approx(0.925)]
    assert regret.SCORES["learning_potential"](mean_return=0.3, mu_slow=0.925) == pytest.approx(0.625)


def _env(env_id, returns, skill="Optimization", **kw):
    return train.PoolEnv(env_id, skill, "src", "XEnv", "designer", returns=list(returns), **kw)


def _designs(*envs):
    """The epoch's buffer: one designer sample per environment."""
    return [train.Design(e, [1], [2], [-0.5]) for e in envs]


def test_score_epoch_blend_with_the_default_plateau_band():
    """The loop's band is the paper's [0.4, 0.6] with a 0.25 ramp (config defaults): w on both
    ramps and past the far end, by hand, with regret 0 so the score is 0.6 * plateau(w)."""
    envs = [_env("up", [1] * 7 + [0] * 3, regret=0.0),   # w 0.7: 1 - 0.1 / 0.25 = 0.6
            _env("low", [1, 0, 0, 0], regret=0.0),        # w 0.25: 1 - 0.15 / 0.25 = 0.4
            _env("out", [1] * 7 + [0], regret=0.0)]       # w 0.875 > 0.6 + 0.25: 0
    scores = [s.score for s in train.score_epoch(_designs(*envs), config.RegretArgs())]
    assert scores == [pytest.approx(0.36), pytest.approx(0.24), 0.0]


def test_score_epoch_learning_potential_over_two_epochs():
    reward, lp = config.RegretArgs(designer_reward="learning_potential"), {}
    # epoch 1: the skill's plays average (1 + 0 + 1 + 1) / 4 = 0.75 -> mu = [0.75, 0.75]
    scores = [s.score for s in train.score_epoch(_designs(_env("a", [1, 0]), _env("b", [1, 1])), reward, lp)]
    assert lp == {"Optimization": [0.75, 0.75]} and scores == [pytest.approx(0.25), pytest.approx(0.25)]
    # epoch 2: mean 0.25 -> slow = 0.15 * 0.75 + 0.85 * 0.25 = 0.325; |0 - 0.325|, |0.5 - 0.325|
    scores = [s.score for s in train.score_epoch(_designs(_env("c", [0, 0]), _env("d", [0, 1])), reward, lp)]
    assert lp["Optimization"] == [pytest.approx(0.26), pytest.approx(0.325)]
    assert scores == [pytest.approx(0.325), pytest.approx(0.175)]


def test_score_epoch_regret_uses_the_window_mean_and_the_timeout_penalty():
    reward = config.RegretArgs(designer_reward="regret")
    envs = [_env("a", [1, 0, 0, 0], r_hint=1.0, regret=0.5),          # 1.0 - 0.25
            _env("b", [1, 1], r_hint=0.5, regret=0.0),                # floored: 0
            _env("c", [0], faulty=True, timed_out=True),              # a step timed out: -0.5
            _env("d", [0], faulty=True, r_hint=1.0)]                  # other faults: 0 (deviation 2)
    assert [s.score for s in train.score_epoch(_designs(*envs), reward)] == [pytest.approx(0.75), 0.0, -0.5, 0.0]


def test_regret_timeout_penalty_only_at_the_regeneration_step():
    """The authors stamp -0.5 only on games whose plays (hinted or not) timed out during the
    regeneration rollout; a later timeout is a fault like any other: 0 (deviation 2)."""
    from types import SimpleNamespace as NS
    fresh, hinted, late = _env("a", []), _env("b", [0]), _env("c", [0])
    eps = [NS(env_id=i, ret=0.0, hinted=h, status="env_error", error="timeout", rewards=[])
           for i, h in [("a", False), ("b", True)]]
    train.record_plays([fresh, hinted], eps, regen=True)
    train.record_plays([late], [NS(env_id="c", ret=0.0, hinted=False, status="env_error",
                                   error="episode_timeout", rewards=[])], regen=False)
    stepped = _env("d", [0])  # a step() past its deadline one step after the regeneration step
    train.record_plays([stepped], [NS(env_id="d", ret=0.0, hinted=False, status="env_error",
                                      error="timeout", actions=["\\boxed{1}"], rewards=[])],
                       regen=False)
    assert fresh.timed_out and hinted.timed_out and late.faulty and not late.timed_out
    assert stepped.faulty and not stepped.timed_out
    regret_only = config.RegretArgs(designer_reward="regret")
    scored = train.score_epoch(_designs(fresh, hinted, late, stepped), regret_only)
    assert [s.score for s in scored] == [-0.5, -0.5, 0.0, 0.0]


def test_which_timeouts_earn_the_regret_ablations_penalty():
    """As the authors flag a game: a load, reset or step() call past its deadline, in both arms;
    in tool use a step unless it makes tool calls (an answer, or a reply with neither, which they
    step raw; their tool calls go through execute_tool, whose timeouts they leave unflagged);
    never the episode's whole budget (their 300 s limit)."""
    from types import SimpleNamespace as NS

    def ep(error, *actions):
        return NS(error=error, actions=list(actions))
    games = [ep("timeout"), ep("timeout", "\\boxed{1}"), ep("episode_timeout", "\\boxed{1}"),
             ep("step_error", "\\boxed{1}")]
    assert [train.stamps_timeout(e, "games") for e in games] == [True, True, False, False]
    call = '<tool_call>{"name": "ls", "arguments": {}}</tool_call>'
    tool = [ep("timeout"), ep("timeout", call), ep("timeout", call, "<answer>done</answer>"),
            ep("timeout", "no call"), ep("episode_timeout", "<answer>done</answer>")]
    assert [train.stamps_timeout(e, "tool") for e in tool] == [True, False, True, True, False]
    envs = [_env(i, []) for i in "abc"]
    train.record_plays(envs, [NS(env_id=i, ret=0.0, hinted=False, status="env_error", rewards=[], **vars(e))
                              for i, e in zip("abc", tool[1:4])], regen=True, setting="tool")
    assert [e.timed_out for e in envs] == [False, True, True] and all(e.faulty for e in envs)


def test_plateau_band_flags_for_the_later_4b_phase(capsys):
    """The authors' later 4B phase: --max_context 49152 and plateau [0.2, 0.4], ramp 0.2. w = 0.5
    sits 0.1 above that band: plateau 1 - 0.1 / 0.2 = 0.5 (the paper's band [0.4, 0.6]: 1); blend
    with regret 0.15 and w 0.1: 0.4 * 1 + 0.6 * 0.5 = 0.7 (paper: 0.1 is 0.3 below 0.4, past the
    ramp of 0.25: 0.4)."""
    late = ["--plateau_lo", "0.2", "--plateau_hi", "0.4", "--plateau_ramp", "0.2"]
    cfg = printed(capsys, "--model", "Qwen3-4B", "--max_context", "49152", *late)
    assert [cfg[k] for k in ("plateau_lo", "plateau_hi", "plateau_ramp", "max_context")] == \
        [0.2, 0.4, 0.2, 49152]
    band = dict(plateau_lo=0.2, plateau_hi=0.4, plateau_ramp=0.2)
    for kw, solve, blend in [(band, 0.5, 0.7), ({}, 1.0, 0.4)]:
        solve_rate = config.RegretArgs(designer_reward="solve_rate", **kw)
        s = train.score_epoch(_designs(_env("a", [1, 0])), solve_rate)
        b = train.score_epoch(_designs(_env("b", [0.1], regret=0.15)), config.RegretArgs(**kw))
        assert (s[0].score, b[0].score) == (pytest.approx(solve), pytest.approx(blend))
    with pytest.raises(SystemExit, match="--plateau_lo must be <= --plateau_hi"):
        train.main(["--model", "tiny", "--plateau_lo", "0.5", "--plateau_hi", "0.4",
                    "--print_config"])


# ----------------------------------------------------------------------------------------------
# the Fixed-env GRPO baseline


def test_fixed_env_schedule_by_hand():
    # Random(42) shuffles [0..4] to [3, 1, 2, 4, 0]; the pool is used up before any repeat, then a
    # fresh shuffle [3, 2, 0, 4, 1] fills the third step without repeating 0 and continues.
    assert pools.fixed_env_schedule(5, 2, 4) == [[3, 1], [2, 4], [0, 3], [2, 4]]
    many = pools.fixed_env_schedule(100, 24, 5)
    assert all(len(set(d)) == 24 for d in many)
    assert len(set(sum(many[:4], []))) == 96  # no repeat before the pool of 100 is used up
    assert set(range(100)) - set(sum(many[:4], [])) <= set(many[4])  # the 4 left over come first
    assert all(sorted(d) == [0, 1, 2] for d in pools.fixed_env_schedule(3, 24, 2))  # k capped at n


@pytest.mark.slow
def test_generate_pool_resumes_and_feeds_fixed_env_grpo(tmp_path):
    from infra import models
    from runs import BASE, coin_script
    tiny = models.build_tiny("tiny", seed=0)
    pool = tmp_path / "pool"
    flags = BASE + ["--num_envs", "2", "--output_dir", str(pool)]
    assert main_with(coin_script(*tiny), flags + ["--generate_pool", "2"]) == pool
    manifest = json.loads((pool / "manifest.json").read_text())
    assert sorted(manifest) == ["env_00000.py", "env_00001.py"]
    assert all(v["setting"] == "games" and v["class_name"] == "CoinEnv" for v in manifest.values())
    first = (pool / "env_00000.py").read_text()
    main_with(coin_script(*tiny), flags + ["--generate_pool", "3"])  # continues, keeps the two
    assert len(json.loads((pool / "manifest.json").read_text())) == 3
    assert (pool / "env_00000.py").read_text() == first
    assert json.loads((pool / "pool_state.json").read_text())["round"] >= 2
    # the baseline draws --num_envs of them per step
    run = main_with(coin_script(*tiny), BASE + ["--fixed_envs", str(pool), "--num_envs", "2", "--steps", "2", "--plays", "2",
                             "--output_dir", str(tmp_path / "run")])
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["env/pool_size"] for r in rows] == [2, 2] and "designer/attempts" not in rows[0]


def test_regret_ablation_reproduces_the_authors_case():
    """The authors' regret_based case: hint 0.8 vs plays (0.2, 0.2); 0.1 vs (0.5, 0.5); a step
    timeout; a game without data; centered per skill and scaled by 10 -> 3, -3, -2.5, 2.5."""
    import grpo
    reward = config.RegretArgs(designer_reward="regret")
    envs = [_env("g1", [0.2, 0.2], skill="logic", r_hint=0.8), _env("g2", [0.5, 0.5], skill="logic", r_hint=0.1),
            _env("g3", [], skill="math", faulty=True, timed_out=True), _env("g4", [], skill="math")]
    scored = train.score_epoch(_designs(*envs), reward)
    adv = grpo.designer_advantages([s.score for s in scored], [s.env.skill for s in scored], 10.0)
    assert adv.tolist() == [pytest.approx(3.0), pytest.approx(-3.0), pytest.approx(-2.5), pytest.approx(2.5)]


def test_learning_potential_reproduces_the_authors_case(monkeypatch):
    """The authors' delayed learning-potential case (their test trackers: gammas 0.8 / 0.2, seeded
    with 0.0): plays (1, 1), (0, 0), (0.5, 0.5) -> skill mean 0.5 -> mu = (0.4, 0.1); raws 0.9,
    0.1, 0.4 centered and scaled by 10."""
    import grpo
    import regret
    update = regret.learning_potential_update
    monkeypatch.setattr(regret, "learning_potential_update",
                        lambda mu, r: update(mu, r, gammas=(0.8, 0.2)))
    lp = {"logic": [0.0, 0.0]}
    envs = [_env("g1", [1.0, 1.0], skill="logic"), _env("g2", [0.0, 0.0], skill="logic"),
            _env("g3", [0.5, 0.5], skill="logic")]
    scored = train.score_epoch(_designs(*envs), config.RegretArgs(designer_reward="learning_potential"), lp)
    assert lp["logic"] == [pytest.approx(0.4), pytest.approx(0.1)]
    adv = grpo.designer_advantages([s.score for s in scored], ["logic"] * 3, 10.0).tolist()
    assert adv == [pytest.approx(4.333333333333333), pytest.approx(-3.6666666666666665),
                   pytest.approx(-0.6666666666666666)]
