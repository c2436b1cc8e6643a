"""skill: Logical Deduction. Find the one counterfeit coin among nine, and whether it is heavy or light, with at most four weighings."""
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


class CounterfeitCoinEnv:
    """Coins 1-9; one is fake and either heavier or lighter. A balance compares two equal pans."""

    N = 9

    def __init__(self, max_turns=10, max_weighings=4):
        self.max_turns = max_turns
        self.max_weighings = max_weighings
        self.reset(seed=0)

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.fake = rng.randint(1, self.N)
        self.kind = rng.choice(["heavy", "light"])
        self.turn = 0
        self.log = []
        self.candidates = {(c, k) for c in range(1, self.N + 1) for k in ("heavy", "light")}
        self.done = False
        obs = ("Nine coins are numbered 1 to 9. Exactly one is counterfeit: it is either heavier or "
               "lighter than the others, which all weigh the same. A balance compares two pans holding "
               "the same number of coins.\n" + self._status())
        return obs, {}

    def _weigh(self, left, right):
        def weight(pan):
            return sum(10 + (1 if self.kind == "heavy" else -1) * (c == self.fake) for c in pan)
        lw, rw = weight(left), weight(right)
        return "left heavier" if lw > rw else "right heavier" if rw > lw else "balanced"

    def _status(self):
        past = "; ".join(self.log) or "none yet"
        left = self.max_weighings - len(self.log)
        return (f"Weighings so far: {past}. Weighings left: {left}. Turns left: {self.max_turns - self.turn}.\n"
                "Actions: \\boxed{weigh 1 2 3 vs 4 5 6} (equal numbers of distinct coins per pan), or "
                "\\boxed{answer C heavy} / \\boxed{answer C light} (one attempt).")

    def _parse_weigh(self, text):
        if text.count("vs") != 1:
            return None
        sides = []
        for part in text.split("vs"):
            try:
                coins = [int(t) for t in part.replace(",", " ").split()]
            except ValueError:
                return None
            sides.append(coins)
        left, right = sides
        every = left + right
        if not left or len(left) != len(right) or len(set(every)) != len(every):
            return None
        if any(c < 1 or c > self.N for c in every):
            return None
        return left, right

    def step(self, action):
        if self.done:
            return "The episode is over. " + self._status(), 0.0, True, False, {}
        self.turn += 1
        move = (_extract_move(action) or "").lower()
        words = move.split()
        reward = 0.0
        if words[:1] == ["weigh"]:
            pans = self._parse_weigh(" ".join(words[1:]))
            if len(self.log) >= self.max_weighings:
                msg = "You have used all your weighings; give your answer."
            elif pans is None:
                msg = "Invalid weighing: use e.g. \\boxed{weigh 1 2 vs 3 4} with equal, distinct coins 1-9."
            else:
                left, right = pans
                result = self._weigh(left, right)
                self.log.append(f"{' '.join(map(str, left))} vs {' '.join(map(str, right))}: {result}")
                # Keep the (coin, kind) hypotheses that would have produced the same reading.
                saved = (self.fake, self.kind)
                keep = set()
                for cand in self.candidates:
                    self.fake, self.kind = cand
                    if self._weigh(left, right) == result:
                        keep.add(cand)
                self.fake, self.kind = saved
                self.candidates = keep
                reward = 0.5 * (1 - (len(keep) - 1) / (2 * self.N - 1))
                msg = f"Result: {result}."
        elif words[:1] == ["answer"] and len(words) == 3 and words[1].isdecimal() and words[2] in ("heavy", "light"):
            self.done = True
            if int(words[1]) == self.fake and words[2] == self.kind:
                return f"Correct: coin {self.fake} is {self.kind}. You win.", 1.0, True, False, {}
            return f"Wrong: coin {self.fake} was the counterfeit ({self.kind}). You lose.", 0.0, True, False, {}
        else:
            msg = "I could not read a move."
        if self.turn >= self.max_turns:
            self.done = True
            return msg + " The turn budget is exhausted.", 0.0, False, True, {}
        return msg + "\n" + self._status(), float(reward), False, False, {}
