"""Environment memory: what the designer remembers about the environments it wrote before.

SPADE (arXiv 2608.19197; the environment memory of the designer's grounding, Sec. 3.2, updated at
Algorithm 1's last step) keeps a bounded FIFO record of past environments with the agent's win rate
w(e) (share of unhinted plays with return > 0) and the regret (Eq. (3)) each earned. A designer
prompt for a skill shows up to two positive exemplars (at the learning frontier, ranked by regret;
the first 2,000 characters of their code) as inspiration, and one negative example (far too easy or
too hard), so the designer drifts towards the frontier:

    positive(skill) = sample_2(top_10_by_regret({r : r.skill = skill, 0.15 <= r.win_rate <= 0.85}))
    negative(skill) = sample_1({r : r.skill = skill, r.win_rate > 0.9 or r.win_rate < 0.1})

As in the authors' code: the ranking is stable (among equal regrets the OLDER record first), both
draws are `rng.sample` (the memory's own seeded rng, saved by `to_dict()`), positives are shown in
draw order, the negative by class name only.

Symbols (paper -> code):
    M (the memory, capacity 200)    EnvironmentMemory(capacity=CAPACITY)
    w(e) (the agent's win rate)     win_rate(returns) -> MemoryRecord.win_rate
    regret(e), Eq. (3)              MemoryRecord.regret (regret.py computes it)
    the code of e                   MemoryRecord.source (its first CODE_CHARS characters shown)

Deviations from the paper and from the authors' code:
    1. Persistence is one JSON document, memory.json, written atomically (temp file, fsync,
       os.replace), because more than the resumed run reads it: tools/report.py shows each
       environment's record from it and `--memory_from` seeds another run's memory with it. A
       corrupt or mismatched one raises `MemoryFileError`, so a resumed run never silently starts
       with an empty memory.
    2. The whole source is stored and its first 2,000 characters shown with a truncation note
       (authors: cut when stored); the negative is named by its class (authors: the file stem).

Dependencies: standard library only. Test: `pytest tests/test_memory.py`.
"""
from __future__ import annotations

import json
import math
import os
import random
import tempfile
from collections import deque
from dataclasses import asdict, dataclass
from pathlib import Path

# Paper constants.
CAPACITY = 200               # FIFO capacity of the memory
FRONTIER = (0.15, 0.85)      # win rates of positive exemplars (inclusive)
TOO_EASY = 0.9               # win rate above this: negative example ("too easy")
TOO_HARD = 0.1               # win rate below this: negative example ("too hard")
TOP_K = 10                   # positives are sampled from the top-10 by regret
N_POSITIVE = 2               # at most 2 positive exemplars per prompt
CODE_CHARS = 2000            # characters of an exemplar's code shown in the prompt
FORMAT_VERSION = 2


def win_rate(returns) -> float:
    """w(e) as the memory records it: the share of plays with return > 0 (0.0 without plays).
    regret.py's score reads w(e) as the mean return instead, as the authors' code does."""
    return sum(r > 0 for r in returns) / len(returns) if returns else 0.0


class MemoryFileError(ValueError):
    """A memory file that exists but cannot be trusted (bad JSON, wrong shape, bad record)."""


@dataclass
class MemoryRecord:
    """One environment the designer wrote, with how the agent fared on it."""
    skill: str           # skill the environment was written for (prompts filter on it)
    source: str          # the environment's Python source
    win_rate: float      # share of the step's unhinted plays with return > 0, in [0, 1]
    regret: float        # hint-based regret of the step, Eq. (3)
    step: int            # training step of the regeneration that produced it
    class_name: str      # the environment class (named by negative examples)
    setting: str = "games"  # "games" or "tool"

    def __post_init__(self):
        texts = (self.skill, self.source, self.class_name, self.setting)
        if not all(isinstance(x, str) for x in texts):
            raise ValueError("MemoryRecord.skill, .source, .class_name and .setting must be "
                             "strings")
        self.win_rate, self.regret = float(self.win_rate), float(self.regret)
        self.step = int(self.step)
        if not 0.0 <= self.win_rate <= 1.0:
            raise ValueError(f"MemoryRecord.win_rate must lie in [0, 1], got {self.win_rate}")
        if not math.isfinite(self.regret):
            raise ValueError(f"MemoryRecord.regret must be finite, got {self.regret}")


class EnvironmentMemory:
    """FIFO memory of past environments that renders the designer prompt's memory block."""

    def __init__(self, capacity: int = CAPACITY, path: str | os.PathLike | None = None,
                 seed: int = 0):
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.path = Path(path) if path is not None else None
        self.records: deque[MemoryRecord] = deque(maxlen=capacity)  # oldest first, and out first
        self.rng = random.Random(seed)  # exemplar draws; its state is saved with the records

    def add(self, record: MemoryRecord) -> None:
        self.records.append(record)

    # ALGO: exemplar selection

    def positives(self, skill: str) -> list[MemoryRecord]:
        """Up to 2 frontier records of `skill`, drawn from its top 10 by regret, in draw order."""
        lo, hi = FRONTIER
        frontier = [r for r in self.records if r.skill == skill and lo <= r.win_rate <= hi]
        top = sorted(frontier, key=lambda r: -r.regret)[:TOP_K]  # stable: ties keep the older first
        return self.rng.sample(top, min(N_POSITIVE, len(top)))

    def negative(self, skill: str) -> MemoryRecord | None:
        """A record of `skill` that was too easy (> 0.9) or too hard (< 0.1), drawn uniformly."""
        bad = [r for r in self.records
               if r.skill == skill and (r.win_rate > TOO_EASY or r.win_rate < TOO_HARD)]
        return self.rng.sample(bad, 1)[0] if bad else None

    def prompt_block(self, skill: str) -> str:
        """The memory section of a designer prompt for `skill`; "" when nothing qualifies."""
        positives, negative = self.positives(skill), self.negative(skill)
        parts = []
        if positives:
            lines = ["<REFERENCE_ENVIRONMENTS>",
                     f"Earlier environments for the skill {skill!r} that the agent won only some "
                     "of the time. Borrow ideas about structure and complexity from them if they "
                     "help, but build a DIFFERENT environment, not a variation on one of these."]
            for i, r in enumerate(positives, 1):
                code = r.source[:CODE_CHARS]
                if len(r.source) > CODE_CHARS:
                    code += f"\n# ... (truncated: first {CODE_CHARS} characters shown)"
                lines += ["", f"Reference {i}: {r.class_name} (skill: {r.skill}, "
                              f"agent win rate {r.win_rate:.2f}, regret {r.regret:.2f})",
                          "```python", code, "```"]
            lines.append("</REFERENCE_ENVIRONMENTS>")
            parts.append("\n".join(lines))
        if negative is not None:
            verdict = "too easy" if negative.win_rate > TOO_EASY else "too hard"
            parts.append(f"Avoid environments like {negative.class_name}: it was {verdict} for the "
                         f"agent (win rate {negative.win_rate:.2f}).")
        return "\n\n".join(parts)

    # INFRA: persistence and checkpoints

    def to_dict(self) -> dict:
        version, internal, gauss = self.rng.getstate()
        return {"version": FORMAT_VERSION, "capacity": self.capacity,
                "rng": [version, list(internal), gauss],
                "records": [asdict(r) for r in self.records]}

    @classmethod
    def from_dict(cls, data: dict, path: str | os.PathLike | None = None) -> "EnvironmentMemory":
        """Rebuild a memory; raises MemoryFileError on anything malformed."""
        if not isinstance(data, dict) or data.get("version") != FORMAT_VERSION:
            raise MemoryFileError(f"not an environment memory of format version {FORMAT_VERSION}")
        capacity, records = data.get("capacity"), data.get("records")
        if type(capacity) is not int or capacity < 1 or not isinstance(records, list):
            raise MemoryFileError("environment memory needs an int 'capacity' >= 1 and a list "
                                  "'records'")
        memory = cls(capacity=capacity, path=path)
        try:
            version, internal, gauss = data["rng"]
            memory.rng.setstate((version, tuple(internal), gauss))
        except (KeyError, TypeError, ValueError) as e:
            raise MemoryFileError(f"environment memory needs the state of its rng: {e}") from e
        for i, raw in enumerate(records):
            try:  # a missing or unknown field, or no mapping at all, is a TypeError
                memory.add(MemoryRecord(**raw))
            except (TypeError, ValueError) as e:
                raise MemoryFileError(f"record {i} is invalid: {e}") from e
        return memory

    def save(self) -> Path:
        """Write the memory to its path as JSON atomically (temp file, fsync, rename, fsync of the
        directory): a crash leaves the previous file intact."""
        target = self.path
        if target is None:
            raise ValueError("EnvironmentMemory.save needs a path (none given at construction)")
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(self.to_dict(), f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, target)  # atomic on POSIX: readers see the old or the new file
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        dir_fd = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)  # make the rename itself durable
        finally:
            os.close(dir_fd)
        return target
