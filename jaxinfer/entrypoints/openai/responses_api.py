"""``/v1/responses``: create (JSON or streamed), retrieve and delete responses, list their input items.

A request is checked (`responses_input.check_supported`), its conversation assembled (the
stored conversation and output of ``previous_response_id``, then its ``input``), mapped onto
a chat request (`responses_input.chat_request`) and run by the chat path
(`jaxinfer.entrypoints.openai.serving.run_chat`): the same template, sampling parameters,
structured-output grammar, tool-call parsing, admission, degradation and disconnect
handling as ``/v1/chat/completions``. Only the answer's shape differs
(`responses_output`, `responses_stream`). Finished responses are stored unless ``store:
false`` (`responses_store`; in memory, bounded, lost on restart).

Errors: 400 for what the server does not implement (named), 404 ``response_not_found``
for an unknown, evicted, expired or deleted id (``GET``, ``DELETE``, ``input_items``,
``previous_response_id``), and the chat path's errors with the Responses field names
(``input``, ``max_output_tokens``, ``text``).
"""
from __future__ import annotations

import pydantic
from fastapi import Request

from jaxinfer.entrypoints.openai import params as params_mod
from jaxinfer.entrypoints.openai import responses_input as I
from jaxinfer.entrypoints.openai import responses_items
from jaxinfer.entrypoints.openai.errors import APIError, from_exception
from jaxinfer.entrypoints.openai.responses_output import ResponsesFormat, Splitter
from jaxinfer.entrypoints.openai.responses_protocol import ResponseDeleted, ResponsesRequest
from jaxinfer.entrypoints.openai.responses_store import ResponseStore
from jaxinfer.entrypoints.openai.responses_stream import response_events
from jaxinfer.entrypoints.openai.serving import ServingContext, run_chat
from jaxinfer.errors import RequestError
from jaxinfer.reasoning import get_parser


def not_found(response_id: str, param: str | None = None) -> APIError:
    return APIError(404, f"no stored response with id {response_id!r} (never stored, stored with store: false, "
                         f"deleted, or evicted by the server's response store limits; stored responses do not "
                         f"survive a restart)", param=param, code="response_not_found")


def history_items(output: list[dict]) -> list[dict]:
    """A stored response's output items as normalized input items (reasoning left out; each
    keeps its output item's ``id``)."""
    items = []
    for item in output:
        if item["type"] == "message":
            text = "".join(part.get("text", "") for part in item["content"])
            items.append({"id": item["id"], "type": "message", "role": "assistant", "content": text})
        elif item["type"] == "function_call":
            items.append({k: item[k] for k in ("id", "type", "call_id", "name", "arguments")})
    return items


def _conversation(req: ResponsesRequest, store: ResponseStore) -> list[dict]:
    """The normalized items of the whole conversation: the stored history, then ``input``.

    Raises:
      APIError: 404 for an unknown ``previous_response_id``.
      RequestError: a malformed ``input``.
    """
    items = I.normalize_items(req.input)
    if req.previous_response_id is None:
        return items
    previous = store.get(req.previous_response_id)
    if previous is None:
        raise not_found(req.previous_response_id, "previous_response_id")
    return previous.conversation + history_items(previous.response["output"]) + items


def _will_store(req: ResponsesRequest, store: ResponseStore) -> bool:
    if req.store and not store.enabled:
        raise RequestError("store: true, but this server stores no responses (--responses-store-max-entries 0)",
                           param="store")
    return req.store is not False and store.enabled


async def create_response(req: ResponsesRequest, raw: Request, ctx: ServingContext):
    """``POST /v1/responses``."""
    store = ctx.responses
    try:
        I.check_supported(req)
        stored = _will_store(req, store)
        conversation = _conversation(req, store)
        chat = I.chat_request(req, conversation)
        parse_tools = params_mod.tool_mode(chat) != "none"
        max_calls = 1 if params_mod.single_call(chat) else None
    except RequestError as exc:
        raise from_exception(exc) from exc
    except pydantic.ValidationError as exc:  # the mapping checks what chat validates; a backstop
        raise APIError(400, f"input does not form a valid conversation: {exc.errors()[0].get('msg')}",
                       param="input") from exc

    def on_done(body: dict) -> None:
        if stored and not store.put(body, conversation):  # larger than the whole budget
            body["store"] = False

    def make_fmt(model, engine, params, mode) -> ResponsesFormat:
        splitter = Splitter(parse_tools, max_calls, get_parser(engine.config.reasoning_parser), mode)
        return ResponsesFormat(req, model.name, splitter=splitter, store=stored, on_done=on_done,
                               tokenizer=engine.tokenizer)

    return await run_chat(chat, raw, ctx, aliases=I.error_aliases(chat), make_fmt=make_fmt, sse=response_events)


def retrieve_response(response_id: str, ctx: ServingContext) -> dict:
    """``GET /v1/responses/{id}``: the stored response object (404 if not stored)."""
    found = ctx.responses.get(response_id)
    if found is None:
        raise not_found(response_id)
    return found.response


def delete_response(response_id: str, ctx: ServingContext) -> ResponseDeleted:
    """``DELETE /v1/responses/{id}`` (404 if not stored)."""
    if not ctx.responses.delete(response_id):
        raise not_found(response_id)
    return ResponseDeleted(id=response_id)


def list_input_items(response_id: str, ctx: ServingContext, *, limit: int, order: str, after: str | None,
                     before: str | None, include: list[str] | None) -> dict:
    """``GET /v1/responses/{id}/input_items``: a page of the stored response's input items
    (`responses_items`; 404 if not stored, 400 for a non-empty ``include`` or an unknown cursor)."""
    if include:
        raise APIError(400, f"include is not supported (got {include}); send [] or omit it", param="include")
    found = ctx.responses.get(response_id)
    if found is None:
        raise not_found(response_id)
    try:
        return responses_items.item_page(found.conversation, limit=limit, order=order, after=after, before=before)
    except RequestError as exc:
        raise from_exception(exc) from exc
