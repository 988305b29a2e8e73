"""Request and response bodies of ``/v1/responses`` (OpenAI's Responses API), as pydantic models.

The shapes follow the ``openai`` SDK's types (``openai.types.responses``: ``Response``,
``ResponseCreateParams``, the output items and stream events), so the SDK parses what the
server sends. Input items and tools are kept as plain dicts here and checked one by one in
`jaxinfer.entrypoints.openai.responses_input`, which names the offending item in its 400
(``input[2].type``) instead of pydantic's union noise. Fields the server does not implement
(``background``, ``conversation``, ``prompt``, ...) are not declared: like any unknown field
they land in ``model_extra`` and are refused with a 400 naming them
(`jaxinfer.entrypoints.openai.responses_input.check_supported`); a few declared ones are
accepted only at their no-op value (``truncation: "disabled"``, ``include: []``).
"""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema


_TEXT_PARTS = {"type": "array", "items": {"type": "object", "properties": {
    "type": {"enum": ["input_text", "output_text"]}, "text": {"type": "string"}}, "required": ["type", "text"]}}
_ITEM_SCHEMAS = [
    {"title": "message", "type": "object", "properties": {
        "type": {"enum": ["message"]}, "role": {"enum": ["user", "assistant", "system", "developer"]},
        "content": {"anyOf": [{"type": "string"}, _TEXT_PARTS]}}, "required": ["role", "content"]},
    {"title": "function_call", "type": "object", "properties": {
        "type": {"enum": ["function_call"]}, "call_id": {"type": "string"}, "name": {"type": "string"},
        "arguments": {"type": "string", "description": "JSON text"}},
     "required": ["type", "call_id", "name", "arguments"]},
    {"title": "function_call_output", "type": "object", "properties": {
        "type": {"enum": ["function_call_output"]}, "call_id": {"type": "string"},
        "output": {"anyOf": [{"type": "string"}, _TEXT_PARTS]}}, "required": ["type", "call_id", "output"]},
    {"title": "reasoning", "type": "object", "properties": {
        "type": {"enum": ["reasoning"]}, "id": {"type": "string"}, "summary": {"type": "array", "items": {}}},
     "required": ["type", "summary"]},
]
# the documented shapes (``/docs``, and what the schema fuzz generates); checked in responses_input
InputItems = Annotated[str | list[dict[str, Any]], WithJsonSchema(
    {"anyOf": [{"type": "string"}, {"type": "array", "items": {"anyOf": _ITEM_SCHEMAS}}]})]
FunctionTools = Annotated[list[dict[str, Any]] | None, WithJsonSchema({"anyOf": [{"type": "null"}, {
    "type": "array", "items": {"type": "object", "properties": {
        "type": {"enum": ["function"]}, "name": {"type": "string", "pattern": "^[a-zA-Z0-9_-]{1,64}$"},
        "description": {"type": "string"}, "parameters": {"type": "object"}, "strict": {"type": "boolean"}},
        "required": ["type", "name"]}}]})]


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")


class TextFormat(_Strict):
    """``text.format``: ``text``, ``json_object`` or ``json_schema`` (``name``, ``schema``)."""

    type: Literal["text", "json_object", "json_schema"]
    name: str | None = Field(None, max_length=64, pattern=r"^[a-zA-Z0-9_-]+$")
    schema_: dict[str, Any] | None = Field(None, alias="schema", description="The JSON schema the output follows.")
    description: str | None = None
    strict: bool | None = None


class TextConfig(_Strict):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = Field(None, description="Not supported: only null.")


class ResponsesStreamOptions(_Strict):
    include_obfuscation: bool | None = Field(None, description="Accepted; the server never pads events.")


class ResponsesRequest(_Strict):
    """``POST /v1/responses``. Unknown fields, and known ones the server does not implement
    (``background``, ``conversation``, ``prompt``, built-in tools, ...), are a 400 naming them."""

    model: str | None = Field(None, description="The served model name (see `GET /v1/models`).")
    input: InputItems = Field(
        ..., description="Text (one user message), or items: messages (`role`, `content` as text or "
                         "`input_text` / `output_text` parts), `function_call`, `function_call_output`, "
                         "`reasoning` (kept out of the prompt).")
    instructions: str | None = Field(None, description="A system message put first (not carried over by "
                                                       "`previous_response_id`).")
    previous_response_id: str | None = Field(None, description="Continue a stored response: its input and "
                                                               "output come before this `input`.")
    store: bool | None = Field(None, description="Keep the response for `GET /v1/responses/{id}` and "
                                                 "`previous_response_id` (default true; in memory, bounded).")
    stream: bool | None = Field(False, description="Server-sent typed events (`response.created` ... "
                                                   "`response.completed`).")
    stream_options: ResponsesStreamOptions | None = None
    max_output_tokens: int | None = Field(None, ge=1, description="Tokens to generate (default: up to the "
                                                                  "context limit); reaching it gives status "
                                                                  "`incomplete`.")
    temperature: float | None = Field(None, ge=0.0, le=2.0, description="0 = greedy. Default 1.")
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    tools: FunctionTools = Field(None, description="Function tools "
                                                                 "(`{type: function, name, parameters}`).")
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = Field(
        None, description="`none`, `auto`, `required` or `{type: function, name}` (the last two enforced).")
    parallel_tool_calls: bool | None = Field(None, description="false: at most one call (enforced when a "
                                                               "call is forced).")
    text: TextConfig | None = None
    metadata: dict[str, str] | None = Field(None, description="Up to 16 string pairs, echoed and stored.")
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = Field(None, description="Accepted; prefix caching is automatic.")
    truncation: Literal["disabled", "auto"] | None = Field(None, description="Only `disabled`.")
    reasoning: dict[str, Any] | None = Field(None, description="Only null or `{}` (no effort control).")
    include: list[str] | None = Field(None, description="Only empty.")
    # extensions (vLLM names, as on chat completions)
    seed: int | None = None
    top_k: int | None = Field(None, ge=-1)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(None, gt=0.0, le=10.0)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    request_timeout: float | None = Field(None, gt=0)
    priority: int | None = Field(0, ge=-(2**63), lt=2**63)


# ----------------------------------------------------------------------------- responses


class OutputText(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[dict[str, Any]] = Field(default_factory=list)
    logprobs: list[dict[str, Any]] = Field(default_factory=list)


class OutputMessage(BaseModel):
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    status: Literal["in_progress", "completed", "incomplete"]
    content: list[OutputText]


class FunctionCallItem(BaseModel):
    id: str
    type: Literal["function_call"] = "function_call"
    call_id: str
    name: str
    arguments: str = Field(..., description="JSON text.")
    status: Literal["in_progress", "completed", "incomplete"]


class ReasoningText(BaseModel):
    type: Literal["reasoning_text"] = "reasoning_text"
    text: str


class ReasoningItem(BaseModel):
    id: str
    type: Literal["reasoning"] = "reasoning"
    summary: list[dict[str, Any]] = Field(default_factory=list)
    content: list[ReasoningText]
    status: Literal["in_progress", "completed", "incomplete"]


class InputTokensDetails(BaseModel):
    cached_tokens: int = 0
    cache_write_tokens: int = 0


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class ResponseUsage(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class IncompleteDetails(BaseModel):
    reason: Literal["max_output_tokens"]


class ResponseObject(BaseModel):
    """A response (``object: "response"``), as returned, streamed in ``response.completed`` and stored."""

    id: str
    object: Literal["response"] = "response"
    created_at: int
    completed_at: int | None = None
    status: Literal["in_progress", "completed", "incomplete", "failed"]
    error: dict[str, Any] | None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    model: str
    output: list[OutputMessage | FunctionCallItem | ReasoningItem]
    parallel_tool_calls: bool
    previous_response_id: str | None = None
    reasoning: dict[str, Any] | None = None
    store: bool
    temperature: float | None = None
    top_p: float | None = None
    text: dict[str, Any]
    tool_choice: str | dict[str, Any]
    tools: list[dict[str, Any]]
    truncation: Literal["disabled"] = "disabled"
    usage: ResponseUsage | None = None
    user: str | None = None
    metadata: dict[str, str] = Field(default_factory=dict)
    background: bool = False


class ResponseDeleted(BaseModel):
    id: str
    object: Literal["response"] = "response"
    deleted: bool = True


class ResponseItemList(BaseModel):
    """``GET /v1/responses/{id}/input_items``: a cursor page of input items (the SDK's
    ``ResponseItemList``; ``first_id`` / ``last_id`` are null on an empty page)."""

    object: Literal["list"] = "list"
    data: list[dict[str, Any]] = Field(..., description="Input items: message, function_call, "
                                                         "function_call_output; each with an `id`.")
    first_id: str | None
    last_id: str | None
    has_more: bool
