"""The one stop check: why a request must end after its newest token, if it must.

Every stop rule lives here (`check_stop`), called once per sampled token by
`jaxinfer.core.sched.scheduler.Scheduler.update`. Stop strings are matched on the decoded text by
the engine's incremental detokenizer (`jaxinfer.tokenizer.tokenizer.IncrementalDetokenizer`); the
scheduler asks for that match through a callback and passes it in. Plain Python; no JAX
import.
"""
from __future__ import annotations

from jaxinfer.core.request import FinishReason, Request


def check_stop(req: Request, max_model_len: int, stop_string: str | None = None) -> FinishReason | None:
    """Why ``req`` must finish after its newest output token, or None to continue.

    Rules in order (vLLM's order for the token rules; a stop string counts only if no
    token rule fired, as vLLM's detokenizer runs after them):
      1. the token is an EOS id (unless ``ignore_eos``) -> STOP;
      2. the token is in ``stop_token_ids`` -> STOP, ``stop_reason`` = the token id;
      3. ``max_tokens`` output tokens -> LENGTH;
      4. prompt + output reach ``max_model_len`` -> LENGTH;
      5. ``stop_string`` (the stop string the new text matched, if any) -> STOP,
         ``stop_reason`` = that string.

    Args:
      req: the request; its newest token is ``req.output_token_ids[-1]`` (at least one).
      max_model_len: the context limit in tokens.
      stop_string: the stop string matched by the text up to the newest token, or None.
    Returns:
      The finish reason (``req.stop_reason`` set for rules 2 and 5), or None.
    """
    token_id = req.output_token_ids[-1]
    if not req.params.ignore_eos and token_id in req.eos_token_ids:
        return FinishReason.STOP
    if token_id in req.params.stop_token_ids:
        req.stop_reason = token_id
        return FinishReason.STOP
    if req.num_output_tokens >= req.max_tokens or req.num_tokens >= max_model_len:
        return FinishReason.LENGTH
    if stop_string is not None:
        req.stop_reason = stop_string
        return FinishReason.STOP
    return None
