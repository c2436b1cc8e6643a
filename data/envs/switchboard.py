"""skill: Causal Inference. Discover which hidden switch drives each lamp (and whether it is inverted) by intervening on switches."""
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


SWITCHES = "ABCD"
LAMPS = ("L1", "L2", "L3")


class SwitchboardEnv:
    """Each lamp copies (or inverts) exactly one switch; a switch may drive several lamps or none.
    Lamps start in an arrangement that looks suggestive but only interventions reveal the wiring."""

    def __init__(self, max_turns=12):
        self.max_turns = max_turns
        self.reset(seed=0)

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.parent = {lamp: rng.choice(SWITCHES) for lamp in LAMPS}
        self.inverted = {lamp: rng.random() < 0.5 for lamp in LAMPS}
        self.switch = {s: rng.random() < 0.5 for s in SWITCHES}
        self.toggled = set()
        self.turn = 0
        self.done = False
        obs = ("A panel has four switches A, B, C, D and three lamps L1, L2, L3. Each lamp is wired to "
               "exactly one switch: it is on when that switch is on, or, if its wiring is inverted, when that "
               "switch is off. A switch may drive several lamps or none. Find each lamp's switch.\n"
               + self._status())
        return obs, {}

    def _lamp(self, lamp):
        return self.switch[self.parent[lamp]] != self.inverted[lamp]

    def _status(self):
        sw = ", ".join(f"{s}={'on' if self.switch[s] else 'off'}" for s in SWITCHES)
        lamps = ", ".join(f"{l}={'on' if self._lamp(l) else 'off'}" for l in LAMPS)
        return (f"Switches: {sw}. Lamps: {lamps}. Turns left: {self.max_turns - self.turn}.\n"
                "Actions: \\boxed{toggle X} for a switch X in A-D, or \\boxed{answer L1=X L2=Y L3=Z} "
                "(one attempt).")

    def _parse_answer(self, text):
        pairs = text.replace(",", " ").split()
        mapping = {}
        for pair in pairs:
            if "=" not in pair:
                return None
            lamp, sw = pair.split("=", 1)
            if lamp.upper() not in LAMPS or sw.upper() not in SWITCHES:
                return None
            mapping[lamp.upper()] = sw.upper()
        return mapping if set(mapping) == set(LAMPS) else None

    def step(self, action):
        if self.done:
            return "The episode is over.", 0.0, True, False, {}
        self.turn += 1
        move = (_extract_move(action) or "").strip()
        words = move.split()
        if len(words) == 2 and words[0].lower() == "toggle" and words[1].upper() in SWITCHES:
            s = words[1].upper()
            self.switch[s] = not self.switch[s]
            self.toggled.add(s)
            msg = f"You flip switch {s}."
        elif words[:1] and words[0].lower() == "answer":
            mapping = self._parse_answer(" ".join(words[1:]))
            if mapping is None:
                msg = "An answer must name a switch for each lamp, e.g. \\boxed{answer L1=A L2=B L3=A}."
            else:
                self.done = True
                if mapping == self.parent:
                    return "That is the wiring. You win.", 1.0, True, False, {}
                truth = " ".join(f"{l}={self.parent[l]}" for l in LAMPS)
                return f"Wrong wiring; it was {truth}. You lose.", 0.0, True, False, {}
        else:
            msg = "I could not read a move."
        if self.turn >= self.max_turns:
            self.done = True
            return msg + " The turn budget is exhausted.", 0.0, False, True, {}
        # Progress: share of lamps whose driving switch has been intervened on at least once.
        reward = 0.5 * sum(self.parent[l] in self.toggled for l in LAMPS) / len(LAMPS)
        return msg + "\n" + self._status(), float(reward), False, False, {}
