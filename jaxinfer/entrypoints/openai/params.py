"""From an OpenAI-shaped request to `SamplingParams` (and the field names errors should use).

Defaults follow OpenAI: temperature 1, top_p 1, completions ``max_tokens`` 16 (null means
the default; the default, never an explicit value, shrinks to what the context leaves), chat
without a limit (up to the context). ``top_k`` -1 and 0 both disable
top-k. Chat ``logprobs: true`` gives the sampled token's logprob, ``top_logprobs: k`` adds
k alternatives; ``top_logprobs`` without ``logprobs: true`` is a 400.

Structured outputs come from at most one of ``response_format`` (``json_object`` /
``json_schema``), vLLM's ``structured_outputs``, and (chat) ``tool_choice`` ``"required"``
or a named function, which constrain the answer to tool-call blocks
(`jaxinfer.structured_outputs.tool_calls.tool_call_grammar`). ``parallel_tool_calls: false``
holds for every ``tool_choice``: with ``"auto"`` (or unset) and no other constraint the
answer is held to text with at most one call
(`jaxinfer.structured_outputs.tool_calls.at_most_one_call_grammar`); with another
constraint, that one applies (it admits no call block of its own accord) and the answer's
calls are cut to one when parsed. Errors in them name the field the client sent. With a
reasoning parser, `with_reasoning` moves the constraint after the reasoning.
"""
from __future__ import annotations

from jaxinfer.structured_outputs import tool_calls
from jaxinfer.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest, _GenerationRequest
from jaxinfer.errors import RequestError
from jaxinfer.sampling_params import SamplingParams
from jaxinfer.structured_outputs.params import StructuredOutputsParams

COMPLETIONS_DEFAULT_MAX_TOKENS = 16

# engine ``param`` -> request field, per endpoint
COMPLETION_ALIASES = {"prompt_logprobs": "logprobs"}  # echo's prompt logprobs come from ``logprobs``
CHAT_ALIASES = {"prompt": "messages", "logprobs": "top_logprobs"}


def chat_max_tokens(req: ChatCompletionRequest) -> int | None:
    return req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens


def default_max_tokens(requested: int | None, default: int | None, num_prompt_tokens: int,
                       max_model_len: int) -> int | None:
    """The effective ``max_tokens``: the request's, else ``default`` clamped to the room left
    (at least 1, so an over-long prompt still gets its 400 from the engine), else None."""
    if requested is not None or default is None:
        return requested
    return max(1, min(default, max_model_len - num_prompt_tokens))


def chat_aliases(req: ChatCompletionRequest) -> dict[str, str]:
    """Error ``param`` renames for a chat request (``max_tokens`` as the client spelled it)."""
    aliases = dict(CHAT_ALIASES)
    if req.max_completion_tokens is not None:
        aliases["max_tokens"] = "max_completion_tokens"
    aliases.update(structured_aliases(req))
    return aliases


def structured_aliases(req: _GenerationRequest) -> dict[str, str]:
    """``structured_outputs`` errors renamed to the field that carried the constraint (none
    when the request has ``structured_outputs`` itself)."""
    if req.structured_outputs is not None:
        return {}
    if req.response_format is not None:
        return {"structured_outputs": "response_format"}
    if isinstance(req, ChatCompletionRequest) and (tool_mode(req) in ("required", "named") or single_call(req)):
        return {"structured_outputs": "tools"}
    return {}


def tool_mode(req) -> str:
    """``"none"`` (no tools offered or ``tool_choice: none``), ``"auto"``, ``"required"`` or ``"named"``
    for a request with ``tools`` and ``tool_choice`` (chat, or ``/tokenize``).

    Raises:
      RequestError (param ``tool_choice``): a choice without tools, or a name not among them.
    """
    choice = req.tool_choice
    if not req.tools:
        if choice not in (None, "none"):
            raise RequestError("tool_choice needs tools", param="tool_choice")
        return "none"
    if choice is None or isinstance(choice, str):
        return choice or "auto"
    if choice.function.name not in {t.function.name for t in req.tools}:
        raise RequestError(f"tool_choice names {choice.function.name!r}, which is not among the tools",
                           param="tool_choice")
    return "named"


def tools_as_dicts(req) -> list[dict] | None:
    """The request's tools as OpenAI dicts, when they are offered to the model (mode not none)."""
    if tool_mode(req) == "none":
        return None
    return [t.model_dump(exclude_none=True) for t in req.tools]


def structured_constraint(req: _GenerationRequest) -> StructuredOutputsParams | None:
    """The output constraint of a request, or None.

    Raises:
      RequestError: a malformed ``response_format`` / ``structured_outputs``, or several
        constraints at once.
    """
    found = []
    rf = req.response_format
    if rf is not None and rf.type != "text":
        if rf.type == "json_object":
            found.append(("response_format", StructuredOutputsParams(json_object=True)))
        else:
            if rf.json_schema is None or rf.json_schema.schema_ is None:
                raise RequestError("response_format of type json_schema needs json_schema.schema",
                                   param="response_format")
            found.append(("response_format", _constraint(lambda: StructuredOutputsParams(json=rf.json_schema.schema_),
                                                         "response_format")))
    if req.structured_outputs is not None:
        found.append(("structured_outputs",
                      _constraint(lambda: StructuredOutputsParams.from_dict(req.structured_outputs),
                                  "structured_outputs")))
    if isinstance(req, ChatCompletionRequest) and tool_mode(req) in ("required", "named"):
        name = req.tool_choice.function.name if tool_mode(req) == "named" else None
        found.append(("tool_choice", StructuredOutputsParams(grammar=tool_calls.tool_call_grammar(
            tools_as_dicts(req), name, single=req.parallel_tool_calls is False))))
    elif not found and isinstance(req, ChatCompletionRequest) and single_call(req) and tool_mode(req) == "auto":
        found.append(("tool_choice", StructuredOutputsParams(grammar=tool_calls.at_most_one_call_grammar(
            tools_as_dicts(req)))))
    if len(found) > 1:
        raise RequestError(f"only one output constraint per request; got {', '.join(f for f, _ in found)}",
                           param=found[1][0])
    return found[0][1] if found else None


def single_call(req: ChatCompletionRequest) -> bool:
    """``parallel_tool_calls: false`` with tools offered: at most one call per answer."""
    return req.parallel_tool_calls is False and tool_mode(req) != "none"


def with_reasoning(params: SamplingParams, mode: str | None) -> SamplingParams:
    """``params`` with its constraint moved after the reasoning of an output that starts in
    ``mode`` (`jaxinfer.reasoning`; None or ``"content"``: unchanged), as vLLM applies
    structured outputs only once the reasoning has ended."""
    so = params.structured_outputs
    return params if so is None else params.replace(structured_outputs=so.after_reasoning(mode))


def _constraint(make, param: str) -> StructuredOutputsParams:
    try:
        return make()
    except RequestError as exc:
        raise RequestError(exc.message, param=param) from None


def echo_only(req: CompletionRequest) -> bool:
    """``echo`` with ``max_tokens: 0``: score the prompt and generate nothing (what
    lm-evaluation-harness's loglikelihood requests sent before they asked for 1 token)."""
    return bool(req.echo) and req.max_tokens == 0


def completion_params(req: CompletionRequest) -> SamplingParams:
    """Sampling options of a completions request (``n`` fanned out later). With ``echo``
    and ``logprobs``, ``prompt_logprobs`` = ``logprobs``; ``echo`` with ``max_tokens: 0``
    generates one token that the response leaves out (`echo_only`).

    Raises:
      RequestError: unsupported fields (``suffix``, ``best_of``, ``echo`` with ``stream``),
        ``max_tokens: 0`` without ``echo``, bad values.
    """
    if req.max_tokens == 0 and not req.echo:
        raise RequestError("max_tokens must be >= 1 (0 only with echo: true)", param="max_tokens")
    if req.echo and req.stream:
        raise RequestError("echo is not supported with stream: true", param="echo")
    if req.suffix:
        raise RequestError("suffix is not supported", param="suffix")
    if req.best_of is not None and req.best_of != (req.n or 1):
        raise RequestError("best_of is not supported (only null or equal to n)", param="best_of")
    params = _params(req, 1 if echo_only(req) else req.max_tokens, req.logprobs)
    if req.echo and req.logprobs is not None:
        params = params.replace(prompt_logprobs=req.logprobs)
    return params


def chat_params(req: ChatCompletionRequest) -> SamplingParams:
    """Sampling options of a chat request.

    Raises:
      RequestError: ``top_logprobs`` without ``logprobs: true``; bad values.
    """
    if req.top_logprobs is not None and not req.logprobs:
        raise RequestError("top_logprobs needs logprobs: true", param="top_logprobs")
    logprobs = (req.top_logprobs or 0) if req.logprobs else None
    return _params(req, chat_max_tokens(req), logprobs)


def _params(req: _GenerationRequest, max_tokens: int | None, logprobs: int | None) -> SamplingParams:
    if req.stream_options is not None and not req.stream:  # as OpenAI and vLLM: a 400, not ignored
        raise RequestError("stream_options is only allowed with stream: true", param="stream_options")
    top_k = req.top_k if req.top_k is not None else -1
    return SamplingParams(
        n=req.n or 1,
        temperature=_default(req.temperature, 1.0),
        top_p=_default(req.top_p, 1.0),
        top_k=-1 if top_k == 0 else top_k,
        min_p=_default(req.min_p, 0.0),
        presence_penalty=_default(req.presence_penalty, 0.0),
        frequency_penalty=_default(req.frequency_penalty, 0.0),
        repetition_penalty=_default(req.repetition_penalty, 1.0),
        seed=req.seed,
        max_tokens=max_tokens,
        stop=req.stop,
        stop_token_ids=tuple(req.stop_token_ids or ()),
        ignore_eos=bool(req.ignore_eos),
        logprobs=logprobs,
        logit_bias=req.logit_bias or (),  # string keys are checked by SamplingParams
        skip_special_tokens=req.skip_special_tokens is not False,
        include_stop_str_in_output=bool(req.include_stop_str_in_output),
        priority=req.priority or 0,
        structured_outputs=structured_constraint(req),
    )


def _default(value, default):
    return default if value is None else value
