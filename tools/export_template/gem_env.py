"""The GEM face of an exported SPADE environment: a gem.core.Env whose code runs in the sandbox.

    import gem, <package>                  # importing the package registers its environments
    env = gem.make("<package>/<Name>-v0")  # options: proxy.py
    obs, info = env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step(r"\\boxed{42}")
    env.close()
"""
import gem.core

from .proxy import SandboxedEnv


class SpadeGemEnv(SandboxedEnv, gem.core.Env):
    """reset/step/close come from SandboxedEnv. Unlike gem.core.Env.reset, reset(seed) leaves
    this process's `random` and `numpy.random` alone: the environment's randomness lives in its
    worker, drawn from the seed."""
