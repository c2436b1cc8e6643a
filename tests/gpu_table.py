"""The README's GPU table, read as rows: what tests/test_gpu_commands.py checks against the
README's commands and tests/test_memory_order.py replays on a ledger (test files never import
each other)."""
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
HEADER = "| model | setting | config file | TP | flags | card |"


def table_rows() -> list[tuple[str, str, str, int, str, str]]:
    """(model, setting, config file, TP, flags, card) of each row of the README's GPU table."""
    lines = README[README.index(HEADER):].splitlines()[2:]
    rows = []
    for line in lines:
        if not line.startswith("|"):
            break
        model, setting, config_file, tp, flags, card = (c.strip() for c in
                                                        line.strip("|").split("|"))
        rows.append((model, setting, config_file, int(tp), flags, card))
    return rows
