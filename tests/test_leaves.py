"""Copyable leaves (README, "Layout"): each leaf module, with exactly what the README lists beside
it, imports and works in an empty directory that holds nothing else of this repository.

Each case copies the files into a fresh directory and runs a short check there in a separate
interpreter (`python -I`: no PYTHONPATH, no user site, the current directory added by hand), so a
sibling import or a file read from the repository fails the test.
"""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# leaf -> (what travels with it, a check run in the copy's directory)
LEAVES = {
    "agent": ([], "assert agent.parse_action('x \\\\boxed{{42}}') == '\\\\boxed{42}'"),
    "designer": (["data/prompts"], "doc = designer.Document('d', 'a text', False); m = "
                 "designer.designer_messages(designer.GAME_SKILLS[0], document=doc); "
                 "assert 'REFERENCE_DOCUMENT' in m[-1]['content']"),
    "infra/stream": ([], "s = stream.Batched(lambda ps, caps: [stream.Completion([1], [0.0], p, "
                     "'stop') for p in ps]); s.submit((0, 1), 'hi'); "
                     "assert [(k, c.text) for k, c in s.collect()] == [((0, 1), 'hi')]"),
    "memory": ([], "m = memory.EnvironmentMemory(); assert m.prompt_block('Math') == ''"),
    "regret": ([], "assert regret.hint_regret([1, 1], [0, 1]) == 0.5"),
    "grpo": ([], "assert grpo.agent_advantages([1.0, 0.0], [0, 0]).tolist() == [1.0, -1.0]"),
    "infra/metrics": ([], "assert metrics.win_rate([1, 0, 0, 1]) == 0.5"),
    "infra/logprobs": ([], "import torch; lp = logprobs.chunked_logprobs(torch.randn(3, 4), "
                 "torch.nn.Linear(4, 5), torch.tensor([0, 1, 2])); assert lp.shape == (3,)"),
    "infra/engine": (["infra/stream.py"],
                     "assert engine.checkpoint_name('model.layers.0.mlp.gate.weight')"),
    "toolenv": ([], "assert toolenv.ToolEnv().max_turns == 10"),
    "infra/telemetry": ([], "assert telemetry.phase_seconds({'a': 1.0}, 3.5) == {'a': 2.5}"),
    "infra/models": (["data/chat_template.jinja", "data/corpus.jsonl", "data/envs", "configs/models"],
               "m, tok = models.build_tiny('tiny'); assert tok.chat_template; "
               "assert models.architecture('Qwen3-30B-A3B').num_experts == 128"),
    "infra/config": ([], "assert config.parse(['--model', 'tiny'], aliases={}).model.model == 'tiny'"),
    "infra/offload": ([], "import torch; o = offload.TrainerOffload(torch.nn.Linear(2, 2), None, "
                      "enabled=False); o.offload(); o.reload()"),
    "infra/preflight": ([], "assert preflight.card_gib('h200-141gb') == 140.4"),
    "infra/lora": ([], "from transformers import Qwen3Config, AutoModelForCausalLM; "
                   "m = AutoModelForCausalLM.from_config(Qwen3Config(vocab_size=32, hidden_size=16, "
                   "num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=8, "
                   "intermediate_size=32)); lora.add_adapters(m, rank=2, alpha=4.0, dropout=0.0, "
                   "targets='q_proj'); assert lora.is_adapted(m) and len(list(lora.Reference(m)"
                   ".parameters())) == 0"),
    "infra/rundir": ([], "from pathlib import Path; rundir.append_metrics(Path('.'), {'b': 1, 'a': 2}); "
                     "assert rundir.load_run(Path('.'))['rows'] == [{'a': 2, 'b': 1}]"),
    "sandbox": ([], "sb = sandbox.Sandbox(workers=1); "
                "r = sb.run_program('print(6 * 7)'); sb.close(); assert r == ('ok', '42\\n'), r"),
}


@pytest.mark.slow  # a fresh interpreter each, most importing torch: 1-12 s apiece
@pytest.mark.parametrize("leaf", sorted(LEAVES))
def test_leaf_stands_alone(tmp_path, leaf):
    beside, check = LEAVES[leaf]
    for rel in [f"{leaf}.py", *beside]:
        src, dst = ROOT / rel, tmp_path / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        (shutil.copytree if src.is_dir() else shutil.copy)(src, dst)
    # an infra/ leaf is imported from its own folder, without infra/__init__.py; `infra.x` finds
    # only the siblings copied beside it (engine: stream.py), an infra/ without its __init__.py
    folder, name = (tmp_path / leaf).parent, Path(leaf).name
    path = ["."] if folder == tmp_path else [".", ".."]
    code = f"import sys; sys.path[:0] = {path}; import {name}; {check}"
    done = subprocess.run([sys.executable, "-I", "-c", code], cwd=folder, capture_output=True,
                          text=True, timeout=120, env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-3000:]
