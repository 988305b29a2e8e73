"""``GET /v1/responses/{id}/input_items``: a stored response's input items as OpenAI's cursor page.

The input items of a response are every item the model was given to generate it, oldest
first: for a response created with ``previous_response_id``, the chain's earlier inputs and
outputs (as `jaxinfer.entrypoints.openai.responses_api.history_items`: reasoning left out),
then its own ``input``; ``instructions`` are not items. This is the conversation the store
keeps (`jaxinfer.entrypoints.openai.responses_store`), each item with the ``id`` it got when it
entered the conversation (the client's, a new ``msg_``/``fc_``/``fco_`` one, or the output
item's). Items are rendered in the shapes of the ``openai`` SDK's ``ResponseItem`` union
(``ResponseInputMessageItem``, ``ResponseOutputMessage``, ``ResponseFunctionToolCallItem``,
``ResponseFunctionToolCallOutputItem``), with text as one text part.

Paging follows OpenAI's list endpoints: ``order`` ``desc`` (default, newest first) or
``asc``; ``after`` / ``before`` an item id, the page holds the items after / before it in that
order; ``limit`` 1-100 items (with ``before`` alone, the ``limit`` items just before it).
``has_more`` says whether more items lie beyond the page in the paging direction (after it
for ``after`` or no cursor, before it for ``before`` alone). Errors: `jaxinfer.errors.RequestError` (400) naming ``after`` / ``before``
for an id that is not one of the response's input items.
"""
from __future__ import annotations

from jaxinfer.errors import RequestError

DEFAULT_LIMIT = 20
MAX_LIMIT = 100


def render_item(item: dict) -> dict:
    """A normalized conversation item (`responses_input.normalize_items`) as an OpenAI item."""
    kind = item["type"]
    if kind == "message":
        part = "output_text" if item["role"] == "assistant" else "input_text"
        text = {"type": part, "text": item["content"]}
        if part == "output_text":
            text.update(annotations=[], logprobs=[])
        return {"id": item["id"], "type": "message", "role": item["role"], "status": "completed",
                "content": [text]}
    if kind == "function_call":
        return {"id": item["id"], "type": "function_call", "call_id": item["call_id"], "name": item["name"],
                "arguments": item["arguments"], "status": "completed"}
    return {"id": item["id"], "type": "function_call_output", "call_id": item["call_id"],
            "output": item["output"], "status": "completed"}


def item_page(items: list[dict], *, limit: int = DEFAULT_LIMIT, order: str = "desc", after: str | None = None,
              before: str | None = None) -> dict:
    """One page of ``items`` (normalized, oldest first) as ``{object: "list", data, first_id,
    last_id, has_more}``; ``first_id`` / ``last_id`` are null on an empty page.

    Raises:
      RequestError: ``after`` / ``before`` is not the id of one of ``items`` (param: that name).
    """
    ordered = items if order == "asc" else items[::-1]
    ids = [item["id"] for item in ordered]
    start, stop = 0, len(ordered)
    if after is not None:
        start = _index(ids, after, "after") + 1
    if before is not None:
        stop = _index(ids, before, "before")
    window = ordered[start:stop]
    backward = before is not None and after is None  # the items just before the cursor
    page = window[-limit:] if backward else window[:limit]
    has_more = len(window) > limit
    data = [render_item(item) for item in page]
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": has_more}


def _index(ids: list[str], item_id: str, param: str) -> int:
    try:
        return ids.index(item_id)
    except ValueError:
        raise RequestError(f"{param}: {item_id!r} is not an input item of this response", param=param) from None
