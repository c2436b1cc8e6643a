"""skill: Mathematical Reasoning. Recover a hidden quadratic f(x) = a*x^2 + b*x + c by evaluating it at points of your choice."""
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


def _ints(text):
    """All signed integers in text, or None if any comma/space separated token is not one."""
    tokens = text.replace(",", " ").split()
    try:
        return [int(t) for t in tokens]
    except ValueError:
        return None


class HiddenPolynomialEnv:
    """A quadratic with integer coefficients is hidden; queries reveal its values, one per turn."""

    def __init__(self, max_turns=12):
        self.max_turns = max_turns
        self.max_answers = 3
        self.reset(seed=0)

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.a = rng.choice([v for v in range(-4, 5) if v != 0])
        self.b = rng.randint(-9, 9)
        self.c = rng.randint(-9, 9)
        self.turn = 0
        self.answers_left = self.max_answers
        self.queried = {}
        self.done = False
        obs = ("A secret quadratic f(x) = a*x^2 + b*x + c has integer coefficients a, b, c "
               "(a is not zero). Evaluate it at integer points to work out a, b and c.\n" + self._status())
        return obs, {}

    def _f(self, x):
        return self.a * x * x + self.b * x + self.c

    def _status(self):
        known = ", ".join(f"f({x}) = {v}" for x, v in sorted(self.queried.items())) or "none yet"
        return (f"Known values: {known}. Turns used: {self.turn}/{self.max_turns}. "
                f"Answer attempts left: {self.answers_left}.\n"
                "Actions: \\boxed{query X} with an integer -10 <= X <= 10, or \\boxed{answer A B C} "
                "to submit the three coefficients.")

    def _progress(self):
        # Partial credit for information gathered: three distinct points determine a quadratic.
        return 0.3 * min(len(self.queried), 3) / 3

    def step(self, action):
        if self.done:
            return "The episode is over. " + self._status(), 0.0, True, False, {}
        self.turn += 1
        move = _extract_move(action)
        reward, terminated = self._progress(), False
        words = move.lower().split() if move else []
        if not words:
            msg = "I could not read a move. Put exactly one move inside \\boxed{}."
        elif words[0] == "query":
            vals = _ints(" ".join(words[1:]))
            if not vals or len(vals) != 1 or abs(vals[0]) > 10:
                msg = "A query needs one integer X with -10 <= X <= 10, e.g. \\boxed{query 3}."
            else:
                x = vals[0]
                self.queried[x] = self._f(x)
                reward = self._progress()
                msg = f"f({x}) = {self.queried[x]}."
        elif words[0] == "answer":
            vals = _ints(" ".join(words[1:]))
            if not vals or len(vals) != 3:
                msg = "An answer needs three integers, e.g. \\boxed{answer 1 -2 3}."
            elif vals == [self.a, self.b, self.c]:
                self.done = True
                return f"Correct: f(x) = {self.a}x^2 + {self.b}x + {self.c}. You win.", 1.0, True, False, {}
            else:
                self.answers_left -= 1
                if self.answers_left <= 0:
                    self.done = True
                    return "Incorrect, and no answer attempts are left. You lose.", 0.0, True, False, {}
                msg = "Incorrect: those coefficients do not match f."
        else:
            msg = f"Unknown move '{move[:40]}'."
        truncated = self.turn >= self.max_turns
        if truncated:
            self.done = True
            return msg + " The turn budget is exhausted.", 0.0, False, True, {}
        return msg + "\n" + self._status(), float(reward), terminated, False, {}
