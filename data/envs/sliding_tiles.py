"""skill: Spatial Reasoning. Slide numbered tiles on a 2x3 board into order 1 2 3 / 4 5 _ ."""
import random


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


ROWS, COLS = 2, 3
GOAL = (1, 2, 3, 4, 5, 0)  # 0 is the blank, read row by row


def _neighbours(index):
    r, c = divmod(index, COLS)
    out = []
    for dr, dc in ((-1, 0), (1, 0), (0, -1), (0, 1)):
        nr, nc = r + dr, c + dc
        if 0 <= nr < ROWS and 0 <= nc < COLS:
            out.append(nr * COLS + nc)
    return out


def _distance_to_goal(board):
    """Fewest slides from board to GOAL (breadth-first search over the 360 reachable layouts)."""
    start = tuple(board)
    seen, frontier, depth = {start}, [start], 0
    while frontier:
        if GOAL in frontier:
            return depth
        nxt = []
        for state in frontier:
            blank = state.index(0)
            for other in _neighbours(blank):
                cells = list(state)
                cells[blank], cells[other] = cells[other], 0
                cells = tuple(cells)
                if cells not in seen:
                    seen.add(cells)
                    nxt.append(cells)
        frontier, depth = nxt, depth + 1
    return -1


class SlidingTilesEnv:
    """A tile next to the blank can slide into it; the board is scrambled by random legal slides."""

    def __init__(self, max_turns=25):
        self.max_turns = max_turns
        self.reset(seed=0)

    def reset(self, seed=None):
        rng = random.Random(seed)
        board = list(GOAL)
        # Random walks often undo themselves; keep scrambling until the board is 6+ slides from solved.
        while _distance_to_goal(board) < 6:
            board = list(GOAL)
            for _ in range(rng.randint(10, 16)):
                blank = board.index(0)
                other = rng.choice(_neighbours(blank))
                board[blank], board[other] = board[other], board[blank]
        self.board = board
        self.turn = 0
        self.done = False
        obs = ("Tiles 1-5 and one blank sit on a board with 2 rows and 3 columns. Slide a tile that is next "
               "to the blank (up, down, left or right of it) into the blank. Reach the layout\n1 2 3\n4 5 _\n"
               + self._status())
        return obs, {}

    def _movable(self):
        return sorted(self.board[i] for i in _neighbours(self.board.index(0)))

    def _status(self):
        rows = "\n".join(" ".join(str(v) if v else "_" for v in self.board[r * COLS:(r + 1) * COLS])
                         for r in range(ROWS))
        movable = ", ".join(str(t) for t in self._movable())
        return (f"Board:\n{rows}\nTiles that can slide: {movable}. Turns left: {self.max_turns - self.turn}.\n"
                "Action: \\boxed{move T} where T is a tile next to the blank.")

    def step(self, action):
        if self.done:
            return "The episode is over.", 0.0, True, False, {}
        self.turn += 1
        words = (_extract_move(action) or "").lower().split()
        tile = int(words[-1]) if words and words[-1].isdecimal() and len(words[-1]) < 3 else None
        if tile is None or (len(words) == 2 and words[0] != "move") or len(words) > 2:
            msg = "I could not read a move."
        elif tile not in self._movable():
            msg = f"Tile {tile} is not next to the blank."
        else:
            blank, at = self.board.index(0), self.board.index(tile)
            self.board[blank], self.board[at] = tile, 0
            msg = f"You slide tile {tile}."
            if tuple(self.board) == GOAL:
                self.done = True
                return f"Solved in {self.turn} moves. You win.", 1.0, True, False, {}
        if self.turn >= self.max_turns:
            self.done = True
            return msg + " The turn budget is exhausted.", 0.0, False, True, {}
        in_place = sum(1 for i, v in enumerate(self.board) if v and v == GOAL[i])
        return msg + "\n" + self._status(), float(0.5 * in_place / 5), False, False, {}
