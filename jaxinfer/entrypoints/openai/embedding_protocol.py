"""Request and response bodies of ``POST /v1/embeddings``, in OpenAI's shape (pydantic models).

Validated like the other endpoints' bodies (`jaxinfer.entrypoints.openai.protocol`: strict types,
unknown fields accepted and ignored). Fields beyond OpenAI's follow vLLM's embedding request
(``truncate_prompt_tokens``, ``add_special_tokens``, ``normalize``, ``priority``).
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from jaxinfer.entrypoints.openai.protocol import _Strict

MAX_INPUTS = 2048  # OpenAI's limit on the inputs of one embeddings request


class EmbeddingRequest(_Strict):
    """``POST /v1/embeddings`` (served with ``--runner pooling``)."""

    input: str | list[str] | list[int] | list[list[int]] = Field(
        ..., description=f"Text, texts, token ids (used verbatim) or lists of token ids; at most {MAX_INPUTS} "
                         "inputs, none empty.")
    model: str | None = Field(None, description="The served model name (see `GET /v1/models`).")
    encoding_format: Literal["float", "base64"] | None = Field(
        "float", description="`float`: lists of numbers; `base64`: each vector's little-endian float32 bytes, "
                             "base64-encoded.")
    dimensions: int | None = Field(None, ge=1, description="Keep the first `dimensions` values (at most the "
                                                           "model's hidden size), then L2-normalize again.")
    user: str | None = None
    # extensions (vLLM names)
    truncate_prompt_tokens: int | None = Field(
        None, ge=1, description="Keep only the last K tokens of each input; `usage.prompt_tokens` counts K.")
    add_special_tokens: bool | None = Field(True, description="Add the tokenizer's special tokens (BOS) to texts.")
    normalize: bool | None = Field(None, description="L2-normalize the vectors (default true).")
    priority: int | None = Field(0, ge=-(2**63), lt=2**63, description="Scheduling priority, lower first (vLLM); "
                                                                       "used with `--scheduling-policy priority`.")
    request_timeout: float | None = Field(
        None, gt=0, description="Seconds before the request is evicted (overrides `--request-timeout`): HTTP 504.")


class Embedding(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str = Field(..., description="The vector, or its base64 float32 bytes.")


class EmbeddingUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingResponse(BaseModel):
    id: str
    object: Literal["list"] = "list"
    created: int
    model: str
    data: list[Embedding]
    usage: EmbeddingUsage
