"""The Gymnasium face of an exported SPADE environment: a gymnasium.Env with text spaces.

    import gymnasium, <package>                  # importing the package registers its environments
    env = gymnasium.make("<package>/<Name>-v0")  # options: proxy.py
    obs, info = env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step(r"\\boxed{42}")
    env.close()

Spaces. gymnasium.spaces.Text accepts only the characters of its charset, and a charset of all of
Unicode would be a million-entry set; `AnyText` is a Text whose contains() accepts every string
the sandbox lets through (any characters but NUL and lone surrogates, up to max_length) and whose
sample() draws printable ASCII. Observations: up to sandbox.OBS_CAP (32,000) characters, the
sandbox's cap; actions: up to ACTION_CAP characters (the environment sees them whole).
"""
import string

import gymnasium
from gymnasium import spaces

from . import sandbox
from .proxy import SandboxedEnv

ACTION_CAP = 1 << 20


class AnyText(spaces.Text):
    def __init__(self, max_length: int):
        super().__init__(max_length, min_length=0, charset=string.printable)

    def contains(self, x) -> bool:
        if type(x) is not str or len(x) > self.max_length or "\x00" in x:
            return False
        try:
            x.encode("utf-8")                      # a lone surrogate does not encode
        except UnicodeEncodeError:
            return False
        return True


class SpadeGymnasiumEnv(SandboxedEnv, gymnasium.Env):
    metadata = {"render_modes": []}
    observation_space = AnyText(sandbox.OBS_CAP)
    action_space = AnyText(ACTION_CAP)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        gymnasium.Env.reset(self, seed=seed)      # seeds self.np_random, as Gymnasium expects
        return SandboxedEnv.reset(self, seed)
