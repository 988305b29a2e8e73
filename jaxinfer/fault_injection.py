"""A test hook that makes the engine's Nth step raise (the engine fault policy's tests).

Owns `StepFault`: set ``JAXINFER_FAIL_STEP=N`` (a positive integer) in a server's
environment and `jaxinfer.async_engine.AsyncEngine` raises `InjectedStepFault` in place of
its Nth engine step (counting steps that had work, from 1, after warm-up; with several
models each engine counts its own), as a device
error or an out-of-memory in ``step`` would. The process then follows the fault policy of
docs/api.md: the requests in flight fail, ``/live`` and ``/health`` turn 503, and the
server exits non-zero. Unset (the default) it does nothing. A test hook only: never set
it in production.
"""
from __future__ import annotations

import os

ENV_VAR = "JAXINFER_FAIL_STEP"


class InjectedStepFault(RuntimeError):
    """The failure `StepFault` raises in place of an engine step."""


class StepFault:
    """Counts engine steps and raises on the configured one.

    Args:
      fail_at: the 1-based step to fail, or None (never).
    Raises:
      ValueError: ``fail_at`` is not a positive integer.
    """

    def __init__(self, fail_at: int | None = None):
        if fail_at is not None and fail_at < 1:
            raise ValueError(f"{ENV_VAR} must be a positive integer, got {fail_at}")
        self.fail_at = fail_at
        self.steps = 0

    @classmethod
    def from_env(cls, environ=os.environ) -> "StepFault":
        """The hook as ``JAXINFER_FAIL_STEP`` sets it (absent or empty: never fails).

        Raises:
          ValueError: the variable is set but not a positive integer.
        """
        text = environ.get(ENV_VAR, "").strip()
        if not text:
            return cls(None)
        try:
            return cls(int(text))
        except ValueError:
            raise ValueError(f"{ENV_VAR} must be a positive integer, got {text!r}") from None

    def before_step(self) -> None:
        """Call once before each engine step that has work.

        Raises:
          InjectedStepFault: this is the configured step.
        """
        self.steps += 1
        if self.steps == self.fail_at:
            raise InjectedStepFault(f"injected failure of engine step {self.steps} ({ENV_VAR})")
