"""Where the hardware choice lives: `ExecutionPlan`, resolved once per engine (`resolve_plan`)."""
from jaxinfer.platform.execution_plan import (ExecutionPlan, default_attention_backend, resolve_plan,
                                              unroll_from_env)

__all__ = ["ExecutionPlan", "default_attention_backend", "resolve_plan", "unroll_from_env"]
