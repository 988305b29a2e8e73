"""The Responses API's answer built from a finished engine output: output items, usage, status.

`ResponsesFormat` is the format `jaxinfer.entrypoints.openai.serving.run_chat` asks for the
JSON answer (``response``); the stream writer (`jaxinfer.entrypoints.openai.responses_stream`)
uses the same pieces with the item ids it announced, so a streamed response's final object
equals the non-streamed one's (ids and timestamps aside). Every finished response goes to
``on_done`` (the store, when the request is stored).

An answer is split (`Splitter.split`) exactly as chat splits it (`ChatFormat._message`): the
reasoning first when the server has a reasoning parser (``--reasoning-parser``,
`jaxinfer.reasoning`), then content and tool calls (`jaxinfer.structured_outputs.tool_calls.parse`,
a call cut by the token limit dropped, at most one call with ``parallel_tool_calls: false``),
laid out as ``[reasoning?, message?, function_call...]``: the message is there when there is
content, or nothing else (so an output is never empty). ``finish_reason`` ``length`` makes
the response and its message ``incomplete`` with ``incomplete_details.reason``
``max_output_tokens``; the reasoning item is ``completed`` once an answer followed it.
"""
from __future__ import annotations

import dataclasses
import time
import uuid
from typing import Callable

from jaxinfer.entrypoints.openai import responses_protocol as R
from jaxinfer.outputs import RequestOutput
from jaxinfer.reasoning import ReasoningParser
from jaxinfer.structured_outputs import tool_calls


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


@dataclasses.dataclass
class Answer:
    """A model answer split into its parts (``calls``: chat ``tool_calls`` entries)."""

    reasoning: str | None
    content: str | None
    calls: list[dict]


@dataclasses.dataclass(frozen=True)
class Splitter:
    """How answers of one request are split (what chat's format does with the same settings).

    Attributes:
      parse_tools: tools were offered (tool choice not ``none``).
      max_calls: at most this many calls (``parallel_tool_calls: false``: 1), or None.
      reasoning: the server's `ReasoningParser`, or None.
      mode: the mode the output starts in (`ReasoningParser.start_mode`), with a parser.
    """

    parse_tools: bool = False
    max_calls: int | None = None
    reasoning: ReasoningParser | None = None
    mode: str | None = None

    def split(self, text: str, truncated: bool = False) -> Answer:
        """``text`` (finished; ``truncated``: cut by the token limit) as reasoning, content, calls."""
        reasoning, content = self.reasoning.split(text, self.mode) if self.reasoning is not None else (None, text)
        calls = []
        if self.parse_tools:
            parsed, calls = tool_calls.parse(content or "", truncated=truncated)
            calls = calls[:self.max_calls] if self.max_calls is not None else calls
            if calls or parsed != (content or None):  # calls, or a cut call dropped
                content = parsed
        return Answer(reasoning, content, calls)


@dataclasses.dataclass
class ItemIds:
    """The ids of a response's output items (announced first when streamed)."""

    message: str = dataclasses.field(default_factory=lambda: new_id("msg"))
    reasoning: str = dataclasses.field(default_factory=lambda: new_id("rs"))


def message_item(item_id: str, text: str | None, status: str) -> dict:
    content = [] if text is None else [R.OutputText(text=text)]
    return R.OutputMessage(id=item_id, status=status, content=content).model_dump()


def call_item(call: dict, status: str = "completed") -> dict:
    """A chat ``tool_calls`` entry as a ``function_call`` item (item id ``fc_`` + the call id's hex)."""
    fn = call["function"]
    return R.FunctionCallItem(id="fc_" + call["id"].removeprefix("call_"), call_id=call["id"], name=fn["name"],
                              arguments=fn["arguments"], status=status).model_dump()


def reasoning_item(item_id: str, text: str, status: str) -> dict:
    return R.ReasoningItem(id=item_id, content=[R.ReasoningText(text=text)], status=status).model_dump()


def has_message(answer: Answer) -> bool:
    """Whether the output has a message: when there is content, or nothing else at all."""
    return answer.content is not None or (not answer.calls and answer.reasoning is None)


def reasoning_status(answer: Answer, status: str) -> str:
    """The reasoning item's status: ``completed`` once an answer followed it, else the response's."""
    return "completed" if answer.content is not None or answer.calls else status


def output_items(answer: Answer, ids: ItemIds, status: str) -> list[dict]:
    """The output list of a finished answer (``status``: the message's, ``completed`` / ``incomplete``)."""
    items = []
    if answer.reasoning is not None:
        items.append(reasoning_item(ids.reasoning, answer.reasoning, reasoning_status(answer, status)))
    if has_message(answer):
        items.append(message_item(ids.message, answer.content or "", status))
    items.extend(call_item(c) for c in answer.calls)
    return items


def status_of(out: RequestOutput) -> str:
    return "incomplete" if out.outputs[0].finish_reason == "length" else "completed"


def usage(out: RequestOutput, prompt_tokens: int, reasoning_tokens: int = 0) -> dict:
    """``reasoning_tokens``: of the output tokens, those of the reasoning."""
    generated = len(out.outputs[0].token_ids)
    return R.ResponseUsage(input_tokens=prompt_tokens,
                           input_tokens_details=R.InputTokensDetails(cached_tokens=out.num_cached_tokens),
                           output_tokens=generated,
                           output_tokens_details=R.OutputTokensDetails(reasoning_tokens=reasoning_tokens),
                           total_tokens=prompt_tokens + generated).model_dump()


class ResponsesFormat:
    """The answer of one ``/v1/responses`` request.

    Args:
      req: the request (its settings are echoed in the response object).
      model: the served model's name.
      splitter: how its answers are split (tools, reasoning).
      store: whether the response is stored (echoed as ``store``).
      on_done: called with each finished response object (dict).
      tokenizer: counts the reasoning's tokens (``output_tokens_details.reasoning_tokens``:
        the reasoning text re-encoded), or None.
    """

    def __init__(self, req: R.ResponsesRequest, model: str, *, splitter: Splitter, store: bool,
                 on_done: Callable[[dict], None], tokenizer=None):
        self.id = new_id("resp")
        self.created = int(time.time())
        self.req = req
        self.model = model
        self.splitter = splitter
        self.store = store
        self.on_done = on_done
        self.tokenizer = tokenizer

    def split(self, out: RequestOutput) -> Answer:
        comp = out.outputs[0]
        return self.splitter.split(comp.text, truncated=comp.finish_reason == "length")

    def skeleton(self, status: str = "in_progress") -> dict:
        """The response object with no output yet (``response.created`` / ``in_progress``)."""
        req = self.req
        fmt = req.text.format if req.text is not None and req.text.format is not None else None
        text = {"format": fmt.model_dump(by_alias=True, exclude_none=True) if fmt else {"type": "text"}}
        return R.ResponseObject(
            id=self.id, created_at=self.created, status=status, instructions=req.instructions,
            max_output_tokens=req.max_output_tokens, model=self.model, output=[],
            parallel_tool_calls=req.parallel_tool_calls is not False, previous_response_id=req.previous_response_id,
            store=self.store, temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p, text=text, tool_choice=req.tool_choice or "auto",
            tools=req.tools or [], user=req.user, metadata=req.metadata or {}).model_dump()

    def finish(self, out: RequestOutput, prompt_tokens: int, items: list[dict]) -> dict:
        """The finished response object with these output ``items``; handed to ``on_done``
        (which sets ``store`` false when the store could not keep it)."""
        body = self.skeleton(status_of(out))
        body.update(output=items, usage=usage(out, prompt_tokens, self._reasoning_tokens(items)),
                    completed_at=int(time.time()))
        if body["status"] == "incomplete":
            body["incomplete_details"] = {"reason": "max_output_tokens"}
        self.on_done(body)
        return body

    def _reasoning_tokens(self, items: list[dict]) -> int:
        text = "".join(part["text"] for item in items if item["type"] == "reasoning" for part in item["content"])
        if not text or self.tokenizer is None:
            return 0
        return len(self.tokenizer.encode(text, add_special_tokens=False))

    def response(self, outputs: list[RequestOutput], prompt_lengths: list[int]) -> dict:
        """The JSON answer (`serving.run_chat`'s non-streamed path: one output, one prompt)."""
        out = outputs[0]
        items = output_items(self.split(out), ItemIds(), status_of(out))
        return self.finish(out, prompt_lengths[0], items)
