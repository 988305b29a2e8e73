"""The server-sent events of a streamed ``/v1/responses`` request.

Each event is ``event: <type>`` + ``data: <json>`` with a ``sequence_number`` counting from 0,
in the order the ``openai`` SDK's stream helper accumulates (``client.responses.stream``):

  response.created, response.in_progress,
  [message]  response.output_item.added, response.content_part.added,
             response.output_text.delta..., response.output_text.done,
             response.content_part.done, response.output_item.done,
  [per call] response.output_item.added, response.function_call_arguments.delta,
             response.function_call_arguments.done, response.output_item.done,
  response.completed (or response.incomplete when ``max_output_tokens`` cut it).

A failure after the stream began (deadline, engine failure, abort) sends ``error`` and
``response.failed``; there is no ``[DONE]`` line. Text is streamed as it is generated; with
tools offered, text that may be (or lead into) a ``<tool_call>`` block is held back, and the
answer's leading and trailing whitespace too (it is stripped when tools are parsed), so
that the deltas concatenate to the final message text and the final response equals the
non-streamed one (`jaxinfer.entrypoints.openai.responses_output`). Calls are sent whole
once the answer is finished (one arguments delta each). With a reasoning parser, the
answer is held until it is finished (the seam: no incremental reasoning split yet).
"""
from __future__ import annotations

import json
from typing import AsyncIterator

from fastapi import Request

from jaxinfer.entrypoints.openai import responses_output as O
from jaxinfer.entrypoints.openai import serving
from jaxinfer.entrypoints.openai.errors import APIError, from_exception
from jaxinfer.engine.output_stream import OutputStream
from jaxinfer.outputs import RequestOutput
from jaxinfer.structured_outputs.tool_calls import OPEN


def streamable_text(text: str, *, parse_tools: bool) -> str:
    """The part of a growing answer that is surely message text: all of it without tools;
    with tools, what comes before a call block (or a partial ``<tool_call>`` at the end),
    without leading or trailing whitespace. Grows monotonically with ``text``."""
    if not parse_tools:
        return text
    cut = text.find(OPEN)
    head = text if cut < 0 else text[:cut]
    for j in range(min(len(OPEN) - 1, len(head)), 0, -1):
        if head.endswith(OPEN[:j]):
            head = head[:-j]
            break
    return head.strip()


class _Events:
    """Event framing and the sequence counter."""

    def __init__(self):
        self.seq = 0

    def __call__(self, type_: str, **fields) -> str:
        data = {"type": type_, "sequence_number": self.seq, **fields}
        self.seq += 1
        return f"event: {type_}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


class _Writer:
    """What one streamed response has sent: its output items so far, the message's text."""

    def __init__(self, fmt: O.ResponsesFormat):
        self.fmt = fmt
        self.ev = _Events()
        self.ids = O.ItemIds()
        self.items: list[dict] = []  # finished items, in output order
        self.message_index: int | None = None  # output_index of the open message
        self.sent = ""  # message text sent

    @property
    def hold_all(self) -> bool:
        return self.fmt.reasoning_parser is not None

    def start(self) -> list[str]:
        return [self.ev("response.created", response=self.fmt.skeleton()),
                self.ev("response.in_progress", response=self.fmt.skeleton())]

    def progress(self, text: str) -> list[str]:
        """Events for an unfinished answer's new text."""
        if self.hold_all:
            return []
        return self._text_to(streamable_text(text, parse_tools=self.fmt.parse_tools))

    def _open_message(self) -> list[str]:
        self.message_index = len(self.items)
        item = O.message_item(self.ids.message, None, "in_progress")
        return [self.ev("response.output_item.added", output_index=self.message_index, item=item),
                self.ev("response.content_part.added", item_id=self.ids.message, output_index=self.message_index,
                        content_index=0, part={"type": "output_text", "text": "", "annotations": []})]

    def _text_to(self, text: str) -> list[str]:
        events = []
        if text and self.message_index is None:
            events += self._open_message()
        if len(text) > len(self.sent) and text.startswith(self.sent):
            events.append(self.ev("response.output_text.delta", item_id=self.ids.message,
                                  output_index=self.message_index, content_index=0, delta=text[len(self.sent):],
                                  logprobs=[]))
            self.sent = text
        return events

    def finish(self, out: RequestOutput, prompt_tokens: int) -> list[str]:
        """The closing events of a finished answer, ending with ``response.completed`` / ``incomplete``."""
        answer = self.fmt.split(out.outputs[0].text)
        status = O.status_of(out)
        events = []
        if answer.reasoning is not None:
            item = O.reasoning_item(self.ids.reasoning, answer.reasoning, status)
            events += self._whole_item(item)
        if answer.content is not None or not answer.calls or self.message_index is not None:
            events += self._close_message(answer.content or "", status)
        for call in answer.calls:
            events += self._call(O.call_item(call))
        body = self.fmt.finish(out, prompt_tokens, self.items)
        kind = "response.completed" if body["status"] == "completed" else "response.incomplete"
        return events + [self.ev(kind, response=body)]

    def _close_message(self, content: str, status: str) -> list[str]:
        events = [] if self.message_index is not None else self._open_message()
        if not content.startswith(self.sent):  # cannot happen (streamable_text); never resend text
            content = self.sent
        events += self._text_to(content)
        part = {"type": "output_text", "text": content, "annotations": []}
        item = O.message_item(self.ids.message, content, status)
        events += [self.ev("response.output_text.done", item_id=self.ids.message, output_index=self.message_index,
                           content_index=0, text=content, logprobs=[]),
                   self.ev("response.content_part.done", item_id=self.ids.message, output_index=self.message_index,
                           content_index=0, part=part),
                   self.ev("response.output_item.done", output_index=self.message_index, item=item)]
        self.items.append(item)
        return events

    def _whole_item(self, item: dict) -> list[str]:
        index = len(self.items)
        self.items.append(item)
        return [self.ev("response.output_item.added", output_index=index, item={**item, "status": "in_progress"}),
                self.ev("response.output_item.done", output_index=index, item=item)]

    def _call(self, item: dict) -> list[str]:
        index = len(self.items)
        self.items.append(item)
        added = {**item, "arguments": "", "status": "in_progress"}
        return [self.ev("response.output_item.added", output_index=index, item=added),
                self.ev("response.function_call_arguments.delta", item_id=item["id"], output_index=index,
                        delta=item["arguments"]),
                self.ev("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                        name=item["name"], arguments=item["arguments"]),
                self.ev("response.output_item.done", output_index=index, item=item)]

    def fail(self, error: APIError) -> list[str]:
        """``error`` and ``response.failed`` (nothing stored)."""
        body = self.fmt.skeleton("failed")
        body.update(output=self.items, error={"code": error.code or error.type, "message": error.message})
        return [self.ev("error", code=error.code, message=error.message, param=error.param),
                self.ev("response.failed", response=body)]


async def response_events(job, stream: OutputStream, first: list[RequestOutput], index: dict[str, int],
                          raw: Request, ctx: serving.ServingContext) -> AsyncIterator[str]:
    """The event stream of one response (`serving.run_chat`'s ``sse`` hook; one engine request)."""
    ae = job.model.async_engine
    abort = lambda: ae.abort(sorted(stream.unfinished))  # noqa: E731
    writer = _Writer(job.fmt)
    prompt_tokens = len(job.prompts[0].token_ids)
    try:
        async with serving.abort_on_disconnect(raw, abort):
            for event in writer.start():
                yield event
            batch = first
            while True:
                for out in batch:
                    error = serving.stream_failure(out, ctx, job.model)
                    if error is not None:
                        abort()
                        for event in writer.fail(error):
                            yield event
                        return
                    if out.finished:
                        ctx.metrics.observe_finished(out, job.model.name)
                        for event in writer.finish(out, prompt_tokens):
                            yield event
                    else:
                        for event in writer.progress(out.outputs[0].text):
                            yield event
                if stream.finished:
                    return
                try:
                    batch = await stream.next_batch()
                except Exception as exc:
                    for event in writer.fail(from_exception(exc)):
                        yield event
                    return
    finally:
        if not stream.finished:
            abort()
