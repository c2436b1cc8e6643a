"""skill: Logical Deduction. Mastermind-style code search: deduce a hidden 4-digit code from exact/misplaced feedback."""
import random
from collections import Counter


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


def score_guess(secret, guess):
    """(exact, misplaced): right digit in the right place, right digit in the wrong place."""
    exact = sum(s == g for s, g in zip(secret, guess))
    common = sum((Counter(secret) & Counter(guess)).values())
    return exact, common - exact


class CodeBreakerEnv:
    """The secret is 4 digits from 1-6 (repeats allowed); each guess is scored like Mastermind."""

    LENGTH = 4
    DIGITS = "123456"

    def __init__(self, max_turns=12):
        self.max_turns = max_turns
        self.reset(seed=0)

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.secret = "".join(rng.choice(self.DIGITS) for _ in range(self.LENGTH))
        self.turn = 0
        self.history = []
        self.done = False
        obs = ("A secret code of 4 digits, each from 1 to 6 (digits may repeat), is hidden. After each "
               "guess you learn how many digits are exact (right digit, right place) and how many are "
               "misplaced (right digit, wrong place).\n" + self._status())
        return obs, {}

    def _status(self):
        past = "; ".join(f"{g}: {e} exact, {m} misplaced" for g, e, m in self.history) or "none yet"
        return (f"Guesses so far: {past}. Guesses left: {self.max_turns - self.turn}.\n"
                "Action: \\boxed{guess DDDD} with four digits from 1-6, e.g. \\boxed{guess 1122}.")

    def step(self, action):
        if self.done:
            return "The episode is over. " + self._status(), 0.0, True, False, {}
        self.turn += 1
        move = _extract_move(action) or ""
        code = move.lower().replace("guess", "").replace(" ", "").replace(",", "")
        reward = 0.0
        if len(code) != self.LENGTH or any(ch not in self.DIGITS for ch in code):
            msg = "Invalid guess: use exactly four digits from 1-6, e.g. \\boxed{guess 1234}."
        else:
            exact, misplaced = score_guess(self.secret, code)
            self.history.append((code, exact, misplaced))
            if exact == self.LENGTH:
                self.done = True
                return f"{code} is the secret code. You cracked it in {self.turn} turns.", 1.0, True, False, {}
            reward = exact / self.LENGTH * 0.5
            msg = f"{code}: {exact} exact, {misplaced} misplaced."
        if self.turn >= self.max_turns:
            self.done = True
            return msg + " No guesses left; the code stays secret.", 0.0, False, True, {}
        return msg + "\n" + self._status(), float(reward), False, False, {}
