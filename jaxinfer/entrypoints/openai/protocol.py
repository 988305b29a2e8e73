"""Request and response bodies of the HTTP API, in OpenAI's shape (pydantic models).

Requests are validated strictly (``"10"`` or ``1.5`` for an integer field is an error, not
coerced) and unknown fields are accepted and ignored, as OpenAI does. Ranges are declared
here so the OpenAPI page is accurate; `jaxinfer.sampling_params.SamplingParams` checks them
again. Field names beyond OpenAI's follow vLLM (``top_k``, ``min_p``, ``ignore_eos``, ...).
Response models document the shapes the handlers emit (``/docs``).
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_serializer

# ----------------------------------------------------------------------------- requests


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")


class StreamOptions(_Strict):
    include_usage: bool | None = Field(False, description="Send a final chunk with `usage` before `[DONE]`.")
    continuous_usage_stats: bool | None = Field(
        False, description="With `include_usage`: every chunk also carries `usage` (the prompt's tokens and its "
                           "choice's completion tokens so far), as vLLM.")


class JSONSchemaFormat(_Strict):
    """``response_format.json_schema``."""

    name: str = Field(..., min_length=1, max_length=64, pattern=r"^[a-zA-Z0-9_-]+$")
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema", description="The JSON schema the output follows.")
    strict: bool | None = None


class ResponseFormat(_Strict):
    """OpenAI ``response_format``: free text, any JSON object, or JSON following a schema."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaFormat | None = None


class _GenerationRequest(_Strict):
    """Fields shared by completions and chat completions."""

    model: str | None = Field(None, description="The served model name (see `GET /v1/models`).")
    temperature: float | None = Field(None, ge=0.0, le=2.0, description="0 = greedy. Default 1.")
    top_p: float | None = Field(None, gt=0.0, le=1.0, description="Nucleus mass in (0, 1]. Default 1.")
    n: int | None = Field(1, ge=1, le=64, description="Completions per prompt (independent samples).")
    stream: bool | None = Field(False, description="Server-sent events, ending with `data: [DONE]`.")
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = Field(None, description="Strings that end generation (not included).")
    seed: int | None = Field(None, description="Sampling seed; choice i of n uses seed + i.")
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = Field(
        None, description="Token id (as a string) -> bias in [-100, 100] added to its logit.")
    user: str | None = None
    # extensions (vLLM names)
    top_k: int | None = Field(None, ge=-1, description="Keep the k most likely tokens; -1 or 0 disable; "
                                                         "values above the vocabulary size mean the vocabulary.")
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(None, gt=0.0, le=10.0)
    ignore_eos: bool | None = Field(False, description="Keep generating past EOS tokens.")
    stop_token_ids: list[int] | None = Field(None, description="Token ids that end generation, besides EOS.")
    skip_special_tokens: bool | None = Field(True, description="Drop special tokens from the text.")
    include_stop_str_in_output: bool | None = False
    truncate_prompt_tokens: int | None = Field(
        None, ge=1, description="Keep only the last K prompt tokens (left truncation); `usage.prompt_tokens` is K.")
    request_timeout: float | None = Field(
        None, gt=0, description="Seconds before the request is evicted (overrides `--request-timeout`): "
                                "HTTP 504, or an error event in a stream.")
    priority: int | None = Field(0, ge=-(2**63), lt=2**63, description="Scheduling priority, lower first "
                                 "(vLLM); used with `--scheduling-policy priority`. Default 0.")
    allow_fallback: bool | None = Field(
        True, description="false: never move this request to the server's fallback model (`--fallback-model`), "
                          "even when its estimated time to first token exceeds `--degrade-ttft-slo`.")
    response_format: ResponseFormat | None = Field(
        None, description="`{\"type\": \"json_object\"}` or `{\"type\": \"json_schema\", \"json_schema\": "
                          "{\"name\", \"schema\"}}`: the output is JSON (following the schema), enforced by a "
                          "token mask.")
    structured_outputs: dict[str, Any] | None = Field(
        None, description="vLLM's constraint: exactly one of `json` (schema), `regex`, `choice` (list of strings), "
                          "`grammar` (Lark or GBNF).")

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        """``usage`` on every chunk: ``continuous_usage_stats`` counts only with ``include_usage`` (vLLM)."""
        return self.include_usage and bool(self.stream_options.continuous_usage_stats)


class CompletionRequest(_GenerationRequest):
    """``POST /v1/completions``."""

    prompt: str | list[str] | list[int] | list[list[int]] = Field(
        ..., description="Text, texts, token ids (used verbatim, no BOS added) or lists of token ids.")
    max_tokens: int | None = Field(None, ge=0, description="Tokens to generate. Omitted or null: 16, or what "
                                                           "the context leaves if less. 0 only with `echo` (score "
                                                           "the prompt, generate nothing).")
    logprobs: int | None = Field(None, ge=0, description="Top log-probabilities per token (up to the server's "
                                                          "`max_logprobs`); with `echo`, for the prompt's tokens too.")
    echo: bool | None = Field(False, description="Return the prompt before the completion, in `text` and (with "
                                                 "`logprobs`) in the logprobs, whose first token has null "
                                                 "logprobs. Not with `stream`.")
    suffix: str | None = Field(None, description="Not supported: a non-empty value is a 400.")
    best_of: int | None = Field(None, ge=1, description="Only null or equal to n is accepted.")


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class FunctionCall(_Strict):
    name: str
    arguments: str = Field(..., description="The arguments as JSON text.")


class ToolCall(_Strict):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = Field(None, description="An assistant turn's calls (round-trips through "
                                                                "the chat template).")
    tool_call_id: str | None = Field(None, description="For `tool` messages: the call this result answers.")

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(p.text for p in self.content)
        return self.content or ""


class FunctionDefinition(_Strict):
    name: str = Field(..., min_length=1, max_length=64, pattern=r"^[a-zA-Z0-9_-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = Field(None, description="JSON schema of the arguments object.")
    strict: bool | None = None


class Tool(_Strict):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(_Strict):
    name: str


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: NamedFunction


class _ChatTemplateInputs(_Strict):
    """What the chat template renders besides the messages (chat completions and ``/tokenize``)."""

    add_generation_prompt: bool | None = Field(True, description="End the prompt with the assistant header.")
    continue_final_message: bool | None = Field(
        False, description="Continue the last (assistant) message instead of starting a new one.")
    tools: list[Tool] | None = Field(None, description="Functions the model may call (`message.tool_calls`).")
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = Field(
        None, description="`none`, `auto` (default with tools), `required` (at least one call, enforced) or "
                          "`{\"type\": \"function\", \"function\": {\"name\"}}` (that call, enforced).")
    chat_template_kwargs: dict[str, Any] | None = Field(
        None, description="Extra variables for the chat template, e.g. `{\"enable_thinking\": false}` (vLLM).")


class ChatCompletionRequest(_ChatTemplateInputs, _GenerationRequest):
    """``POST /v1/chat/completions``."""

    messages: list[ChatMessage] = Field(..., description="The conversation; rendered with the chat template.")
    max_tokens: int | None = Field(None, ge=1, description="Deprecated alias of `max_completion_tokens`.")
    max_completion_tokens: int | None = Field(None, ge=1, description="Tokens to generate (default: up to "
                                                                       "the context limit).")
    logprobs: bool | None = Field(False, description="Return the log-probability of each output token.")
    top_logprobs: int | None = Field(None, ge=0, le=20, description="Alternatives per token (needs `logprobs`).")
    parallel_tool_calls: bool | None = Field(
        None, description="false: at most one call per answer, enforced by the token mask for every `tool_choice`.")
    include_reasoning: bool | None = Field(
        True, description="With `--reasoning-parser`: false drops the reasoning from the answer (vLLM).")


class TokenizeRequest(_ChatTemplateInputs):
    """``POST /tokenize``: a `prompt` (text or ids) or chat `messages` with the chat request's
    template inputs (`tools`, `tool_choice`, `chat_template_kwargs`, ...), which give the
    ids a chat request with the same fields is prompted with."""

    model: str | None = None
    prompt: str | list[int] | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool | None = Field(True, description="For `prompt` text: add BOS if the tokenizer does.")


class DetokenizeRequest(_Strict):
    model: str | None = None
    tokens: list[int]


# ----------------------------------------------------------------------------- responses


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails = Field(default_factory=PromptTokensDetails)


class CompletionLogprobs(BaseModel):
    """Legacy completions logprobs: parallel lists, one entry per token (with ``echo``, the
    prompt's tokens first, the first of them with null logprobs)."""

    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatLogprobs(BaseModel):
    content: list[TokenLogprob] = Field(default_factory=list)


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: Literal["stop", "length"] | None = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class ToolCallOut(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class AssistantMessage(BaseModel):
    """The answer; ``reasoning_content`` and ``reasoning`` (vLLM's older and newer names of
    the same text) only with ``--reasoning-parser``."""

    role: Literal["assistant"] = "assistant"
    content: str | None
    reasoning_content: str | None = None
    reasoning: str | None = None
    tool_calls: list[ToolCallOut] | None = None

    @model_serializer(mode="wrap")
    def _drop_absent(self, handler):
        return {k: v for k, v in handler(self).items()
                if (k != "tool_calls" or v) and (k not in ("reasoning", "reasoning_content") or v is not None)}


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: Literal["stop", "length", "tool_calls"] | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage | None = None


class DeltaFunction(BaseModel):
    name: str | None = None
    arguments: str | None = None


class DeltaToolCall(BaseModel):
    """A streamed piece of one call; ``index`` says which call it extends."""

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: DeltaFunction


class DeltaMessage(BaseModel):
    """A streamed piece of the assistant message; absent fields are omitted."""

    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None
    tool_calls: list[DeltaToolCall] | None = None

    @model_serializer(mode="wrap")
    def _drop_none(self, handler):
        return {k: v for k, v in handler(self).items() if v is not None}


class ChatChunkChoice(BaseModel):
    index: int
    delta: DeltaMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: Literal["stop", "length", "tool_calls"] | None = None


class ChatCompletionChunk(BaseModel):
    """One SSE event of a chat stream (``data: <json>``)."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class CompletionChunk(BaseModel):
    """One SSE event of a completions stream (``data: <json>``)."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "jaxinfer"
    max_model_len: int | None = None
    kv_cache_memory: int | None = Field(
        None, description="This model's share of `--kv-cache-memory` in bytes per device (several models split it).")
    kv_blocks: int | None = Field(None, description="KV blocks in this model's pool (its own pool).")
    fallback: bool = Field(False, description="True for the model that takes degraded requests (`--fallback-model`).")


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class TokenizeResponse(BaseModel):
    tokens: list[int]
    count: int
    max_model_len: int


class DetokenizeResponse(BaseModel):
    prompt: str


class ErrorBody(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | int | None = None


class ErrorResponse(BaseModel):
    """The envelope of every error (4xx / 5xx)."""

    error: ErrorBody
