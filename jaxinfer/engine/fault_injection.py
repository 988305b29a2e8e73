"""A test hook that makes the engine's Nth step raise (the engine fault policy's tests).

Owns `StepFault`. Set ``JAXINFER_FAIL_STEP=N`` (a positive integer, or several separated
by commas) in a server's environment, and ``JAXINFER_FAIL_PHASE`` to where it raises:

* ``step`` (the default): `jaxinfer.engine.async_engine.AsyncEngine` raises `InjectedStepFault`
  in place of its Nth engine step (counting steps that had work, from 1, after warm-up),
  as a device error or an out-of-memory in ``step`` would. The process then follows the
  fault policy of docs/api.md: the requests in flight fail, ``/live`` and ``/health``
  turn 503, and the server exits non-zero.
* ``prepare``: `jaxinfer.engine.llm_engine.LLMEngine` raises it while preparing the host-side batch
  of its Nth step that has requests to run (after scheduling, before anything of the
  step reaches the device), as a bug in ``batch.prepare`` would. Only that step's
  requests fail (HTTP 500 ``step_failed``) and the server goes on serving (docs/api.md,
  "Engine faults"); several consecutive such failures end it as above.

With several models (or data-parallel replicas) each engine counts its own steps. Unset
(the default) it does nothing. A test hook only: never set it in production.
"""
from __future__ import annotations

import os
from typing import Iterable

ENV_VAR = "JAXINFER_FAIL_STEP"
PHASE_ENV_VAR = "JAXINFER_FAIL_PHASE"
STEP = "step"  # raise in place of the whole engine step (as a device error)
PREPARE = "prepare"  # raise while preparing the step's host-side batch, before the device
PHASES = (STEP, PREPARE)


class InjectedStepFault(RuntimeError):
    """The failure `StepFault` raises in place of an engine step (or of its preparation)."""


class StepFault:
    """Counts engine steps and raises on the configured ones.

    Args:
      fail_at: the 1-based step(s) to fail, or None (never).
      phase: `STEP` or `PREPARE` (where the caller counts; only the message differs).
    Raises:
      ValueError: a step is not a positive integer, or the phase is unknown.
    """

    def __init__(self, fail_at: int | Iterable[int] | None = None, phase: str = STEP):
        steps = set() if fail_at is None else {fail_at} if isinstance(fail_at, int) else set(fail_at)
        if any(n < 1 for n in steps):
            raise ValueError(f"{ENV_VAR} must be positive integers, got {sorted(steps)}")
        if phase not in PHASES:
            raise ValueError(f"{PHASE_ENV_VAR} must be one of {', '.join(PHASES)}, got {phase!r}")
        self.fail_at = frozenset(steps)
        self.phase = phase
        self.steps = 0

    @classmethod
    def from_env(cls, environ=os.environ, phase: str = STEP) -> "StepFault":
        """The hook of ``phase`` as ``JAXINFER_FAIL_STEP`` and ``JAXINFER_FAIL_PHASE`` set it:
        it never fails when the step variable is absent or empty, or when the phase
        variable (default ``step``) names another phase.

        Raises:
          ValueError: a variable is set but malformed (not positive integers; unknown phase).
        """
        text = environ.get(ENV_VAR, "").strip()
        wanted = environ.get(PHASE_ENV_VAR, "").strip() or STEP
        if wanted not in PHASES:
            raise ValueError(f"{PHASE_ENV_VAR} must be one of {', '.join(PHASES)}, got {wanted!r}")
        if not text:
            return cls(None, phase)
        try:
            steps = [int(part) for part in text.split(",")]
        except ValueError:
            raise ValueError(f"{ENV_VAR} must be positive integers separated by commas, got {text!r}") from None
        return cls(steps if wanted == phase else None, phase)

    def before_step(self) -> None:
        """Call once before each engine step that has work (`STEP`), or once while
        preparing each step that has requests to run (`PREPARE`).

        Raises:
          InjectedStepFault: this is a configured step.
        """
        self.steps += 1
        if self.steps in self.fail_at:
            where = "engine step" if self.phase == STEP else "preparation of engine step"
            raise InjectedStepFault(f"injected failure of {where} {self.steps} ({ENV_VAR})")
