"""skill: Optimization. Load crates into a truck with a weight limit to maximise the total value, then submit."""
import itertools
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


class CargoLoadingEnv:
    """A 0/1 knapsack played move by move: add or remove crates, submit when the load is best."""

    N_CRATES = 7

    def __init__(self, max_turns=25):
        self.max_turns = max_turns
        self.reset(seed=0)

    def reset(self, seed=None):
        rng = random.Random(seed)
        while True:
            self.weights = [rng.randint(2, 9) for _ in range(self.N_CRATES)]
            self.values = [rng.randint(3, 20) for _ in range(self.N_CRATES)]
            self.capacity = sum(self.weights) * 2 // 5
            self.best = self._optimum()
            # Reject instances where the greedy value-per-kg load is already optimal: too easy.
            if self._greedy() < self.best:
                break
        self.loaded = set()
        self.turn = 0
        self.done = False
        obs = ("You are loading a delivery truck. Each crate has a weight (kg) and a value; the total "
               f"weight may not exceed {self.capacity} kg. Load the most valuable set of crates, then submit. "
               "You have one submission.\n" + self._status())
        return obs, {}

    def _optimum(self):
        best = 0
        for mask in itertools.product([0, 1], repeat=self.N_CRATES):
            w = sum(wi for wi, m in zip(self.weights, mask) if m)
            if w <= self.capacity:
                best = max(best, sum(vi for vi, m in zip(self.values, mask) if m))
        return best

    def _greedy(self):
        order = sorted(range(self.N_CRATES), key=lambda i: -self.values[i] / self.weights[i])
        w = v = 0
        for i in order:
            if w + self.weights[i] <= self.capacity:
                w, v = w + self.weights[i], v + self.values[i]
        return v

    def _load(self):
        return sum(self.weights[i] for i in self.loaded), sum(self.values[i] for i in self.loaded)

    def _status(self):
        crates = "; ".join(f"crate {i + 1}: {self.weights[i]} kg, value {self.values[i]}"
                           f"{' (loaded)' if i in self.loaded else ''}" for i in range(self.N_CRATES))
        w, v = self._load()
        return (f"Crates: {crates}. Load: {w}/{self.capacity} kg, value {v}. "
                f"Turns left: {self.max_turns - self.turn}.\n"
                "Actions: \\boxed{add K}, \\boxed{remove K} (K = crate number 1-7), \\boxed{submit}.")

    def step(self, action):
        if self.done:
            return "The episode is over.", 0.0, True, False, {}
        self.turn += 1
        words = (_extract_move(action) or "").lower().split()
        crate = None
        if len(words) == 2 and words[1].isdecimal() and 1 <= int(words[1]) <= self.N_CRATES:
            crate = int(words[1]) - 1
        if words == ["submit"]:
            self.done = True
            _, v = self._load()
            if v == self.best:
                return f"Submitted a load worth {v}: that is the best possible. You win.", 1.0, True, False, {}
            return f"Submitted a load worth {v}; a better load worth {self.best} existed. You lose.", 0.0, True, False, {}
        if words[:1] == ["add"] and crate is not None:
            if crate in self.loaded:
                msg = f"Crate {crate + 1} is already loaded."
            elif self._load()[0] + self.weights[crate] > self.capacity:
                msg = f"Crate {crate + 1} does not fit: it would exceed {self.capacity} kg."
            else:
                self.loaded.add(crate)
                msg = f"Loaded crate {crate + 1}."
        elif words[:1] == ["remove"] and crate is not None:
            if crate in self.loaded:
                self.loaded.discard(crate)
                msg = f"Unloaded crate {crate + 1}."
            else:
                msg = f"Crate {crate + 1} is not on the truck."
        else:
            msg = "I could not read a move."
        if self.turn >= self.max_turns:
            self.done = True
            return msg + " The turn budget is exhausted before submission.", 0.0, False, True, {}
        # Progress: share of the value of all crates that is loaded (does not reveal the optimum).
        reward = 0.5 * self._load()[1] / sum(self.values)
        return msg + "\n" + self._status(), float(reward), False, False, {}
