"""skill: Spatial Reasoning. Navigate a 6x6 grid under fog to a known exit, seeing only the four cells next to you."""
import random
from collections import deque


def _extract_move(action):
    """Text inside the last \\boxed{...} with balanced braces, or None when there is none."""
    if not isinstance(action, str):
        return None
    start = action.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 1, start + len("\\boxed{")
    for j in range(i, len(action)):
        if action[j] == "{":
            depth += 1
        elif action[j] == "}":
            depth -= 1
            if depth == 0:
                return action[i:j].strip()
    return None


DIRS = {"north": (-1, 0), "south": (1, 0), "east": (0, 1), "west": (0, -1)}
ALIASES = {"n": "north", "up": "north", "s": "south", "down": "south",
           "e": "east", "right": "east", "w": "west", "left": "west"}


class FogMazeEnv:
    """Walls are hidden until you stand next to them; rows grow southward, columns eastward."""

    SIZE = 6

    def __init__(self, max_turns=30):
        self.max_turns = max_turns
        self.reset(seed=0)

    def reset(self, seed=None):
        rng = random.Random(seed)
        n = self.SIZE
        while True:
            self.walls = {(r, c) for r in range(n) for c in range(n) if rng.random() < 0.22}
            cells = [(r, c) for r in range(n) for c in range(n) if (r, c) not in self.walls]
            if len(cells) < 2:
                continue
            self.start, self.goal = rng.sample(cells, 2)
            dist = self._path_length(self.start, self.goal)
            manhattan = abs(self.start[0] - self.goal[0]) + abs(self.start[1] - self.goal[1])
            # Far enough to need several moves, short enough for a careful explorer in 25 turns.
            if dist is not None and manhattan >= 5 and dist <= 12:
                break
        self.pos = self.start
        self.start_manhattan = manhattan
        self.visited = {self.pos}
        self.turn = 0
        self.done = False
        obs = ("You are in a foggy 6x6 maze. Rows are numbered 0-5 from north to south, columns 0-5 from "
               "west to east. Some cells are walls; you only see the cells directly next to you.\n"
               + self._status())
        return obs, {}

    def _free(self, cell):
        r, c = cell
        return 0 <= r < self.SIZE and 0 <= c < self.SIZE and cell not in self.walls

    def _path_length(self, a, b):
        seen, queue = {a: 0}, deque([a])
        while queue:
            cur = queue.popleft()
            if cur == b:
                return seen[cur]
            for dr, dc in DIRS.values():
                nxt = (cur[0] + dr, cur[1] + dc)
                if self._free(nxt) and nxt not in seen:
                    seen[nxt] = seen[cur] + 1
                    queue.append(nxt)
        return None

    def _look(self):
        parts = []
        for name, (dr, dc) in DIRS.items():
            r, c = self.pos[0] + dr, self.pos[1] + dc
            if not (0 <= r < self.SIZE and 0 <= c < self.SIZE):
                parts.append(f"{name}: edge")
            else:
                parts.append(f"{name}: {'wall' if (r, c) in self.walls else 'open'}")
        return ", ".join(parts)

    def _status(self):
        return (f"You are at (row {self.pos[0]}, col {self.pos[1]}). The exit is at "
                f"(row {self.goal[0]}, col {self.goal[1]}). Around you: {self._look()}. "
                f"Cells visited: {len(self.visited)}. Moves left: {self.max_turns - self.turn}.\n"
                "Actions: \\boxed{north}, \\boxed{south}, \\boxed{east}, \\boxed{west}.")

    def step(self, action):
        if self.done:
            return "The episode is over. " + self._status(), 0.0, True, False, {}
        self.turn += 1
        word = (_extract_move(action) or "").lower().strip()
        word = ALIASES.get(word, word)
        if word not in DIRS:
            msg = "Unknown move; choose one of north, south, east, west."
        else:
            dr, dc = DIRS[word]
            nxt = (self.pos[0] + dr, self.pos[1] + dc)
            if self._free(nxt):
                self.pos = nxt
                self.visited.add(nxt)
                msg = f"You move {word}."
            else:
                msg = f"You bump into a {'wall' if nxt in self.walls else 'maze edge'} and stay put."
        if self.pos == self.goal:
            self.done = True
            return f"You reach the exit in {self.turn} moves. You win.", 1.0, True, False, {}
        if self.turn >= self.max_turns:
            self.done = True
            return msg + " You run out of moves in the fog.", 0.0, False, True, {}
        manhattan = abs(self.pos[0] - self.goal[0]) + abs(self.pos[1] - self.goal[1])
        reward = max(0.0, 0.5 * (1 - manhattan / self.start_manhattan))
        return msg + "\n" + self._status(), float(reward), False, False, {}
