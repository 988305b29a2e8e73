"""The server-sent events of a streamed ``/v1/responses`` request.

Each event is ``event: <type>`` + ``data: <json>`` with a ``sequence_number`` counting from 0,
in the order the ``openai`` SDK's stream helper accumulates (``client.responses.stream``):

  response.created, response.in_progress,
  [reasoning] response.output_item.added, response.content_part.added,
              response.reasoning_text.delta..., response.reasoning_text.done,
              response.content_part.done, response.output_item.done,
  [message]   response.output_item.added, response.content_part.added,
              response.output_text.delta..., response.output_text.done,
              response.content_part.done, response.output_item.done,
  [per call]  response.output_item.added, response.function_call_arguments.delta,
              response.function_call_arguments.done, response.output_item.done,
  response.completed (or response.incomplete when ``max_output_tokens`` cut it).

A failure after the stream began (deadline, engine failure, abort) sends ``error`` and
``response.failed``; there is no ``[DONE]`` line. Text streams as it is generated, split as
chat streams it: the reasoning through `jaxinfer.reasoning.ReasoningStream` (with
``--reasoning-parser``), and, with tools offered, only the content that cannot become a call
(`jaxinfer.structured_outputs.tool_calls.stable_content`), so no call text ever reaches a
delta. Deltas concatenate to the final texts, and the final response equals the
non-streamed one (`jaxinfer.entrypoints.openai.responses_output`; ids aside). Calls are sent
whole once the answer is finished (one arguments delta each).
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
from jaxinfer.reasoning import ReasoningStream
from jaxinfer.structured_outputs import tool_calls


class _Events:
    """Event framing and the sequence counter."""

    def __init__(self):
        self.seq = 0

    def __call__(self, type_: str, **fields) -> str:
        data = {"type": type_, "sequence_number": self.seq, **fields}
        self.seq += 1
        return f"event: {type_}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


class _Part:
    """One streamed text part: the reasoning item's ``reasoning_text`` or the message's ``output_text``."""

    def __init__(self, kind: str, item_id: str):
        self.kind = kind  # "reasoning" or "message"
        self.item_id = item_id
        self.index: int | None = None  # output_index once opened
        self.sent = ""
        self.closed = False

    def part(self, text: str) -> dict:
        return {"type": "reasoning_text", "text": text} if self.kind == "reasoning" else {
            "type": "output_text", "text": text, "annotations": []}

    def item(self, text: str | None, status: str) -> dict:
        if self.kind == "reasoning":
            item = O.reasoning_item(self.item_id, text or "", status)
            return {**item, "content": []} if text is None else item
        return O.message_item(self.item_id, text, status)


class _Writer:
    """What one streamed response has sent: its finished items, the open text part."""

    def __init__(self, fmt: O.ResponsesFormat, mode: str | None):
        self.fmt = fmt
        self.ev = _Events()
        ids = O.ItemIds()
        self.items: list[dict] = []  # output items so far, in output order (finished or open)
        self.reasoning = _Part("reasoning", ids.reasoning)
        self.message = _Part("message", ids.message)
        sp = fmt.splitter
        self.rstream = ReasoningStream(sp.reasoning, mode) if sp.reasoning is not None else None

    def start(self) -> list[str]:
        return [self.ev("response.created", response=self.fmt.skeleton()),
                self.ev("response.in_progress", response=self.fmt.skeleton())]

    def progress(self, text: str) -> list[str]:
        """Events for an unfinished answer's text so far."""
        answer = text
        events = []
        if self.rstream is not None:
            self.rstream.update(text)
            events += self._grow(self.reasoning, self._reasoning_so_far())
            answer = self.rstream.content
        content = tool_calls.stable_content(answer) if self.fmt.splitter.parse_tools else answer
        if content:
            events += self._close(self.reasoning, self._reasoning_so_far(), "completed")
            events += self._grow(self.message, content)
        return events

    def _reasoning_so_far(self) -> str:
        return self.rstream.reasoning if self.rstream is not None else ""

    def _open(self, part: _Part) -> list[str]:
        part.index = len(self.items)
        self.items.append(part.item(None, "in_progress"))
        return [self.ev("response.output_item.added", output_index=part.index, item=part.item(None, "in_progress")),
                self.ev("response.content_part.added", item_id=part.item_id, output_index=part.index,
                        content_index=0, part=part.part(""))]

    def _grow(self, part: _Part, text: str) -> list[str]:
        """Open ``part`` on its first text; a delta for what ``text`` adds to what was sent."""
        if not text or part.closed or not text.startswith(part.sent) or len(text) == len(part.sent):
            return []
        events = self._open(part) if part.index is None else []
        kind = "response.reasoning_text.delta" if part.kind == "reasoning" else "response.output_text.delta"
        extra = {} if part.kind == "reasoning" else {"logprobs": []}
        events.append(self.ev(kind, item_id=part.item_id, output_index=part.index, content_index=0,
                              delta=text[len(part.sent):], **extra))
        part.sent = text
        return events

    def _close(self, part: _Part, text: str, status: str, force: bool = False) -> list[str]:
        """Send what ``text`` adds, then the part's and item's done events (an unopened part
        is opened first only when ``force``)."""
        if part.closed or (part.index is None and not force):
            return []
        events = self._open(part) if part.index is None else []
        if not text.startswith(part.sent):  # cannot happen (the splits are prefix-stable); never resend
            text = part.sent
        events += self._grow(part, text)
        part.closed = True
        item = part.item(text, status)
        self.items[part.index] = item
        done = "response.reasoning_text.done" if part.kind == "reasoning" else "response.output_text.done"
        extra = {} if part.kind == "reasoning" else {"logprobs": []}
        return events + [
            self.ev(done, item_id=part.item_id, output_index=part.index, content_index=0, text=text, **extra),
            self.ev("response.content_part.done", item_id=part.item_id, output_index=part.index, content_index=0,
                    part=part.part(text)),
            self.ev("response.output_item.done", output_index=part.index, item=item)]

    def finish(self, out: RequestOutput, prompt_tokens: int) -> list[str]:
        """The closing events of a finished answer, ending with ``response.completed`` / ``incomplete``."""
        answer = self.fmt.split(out)
        status = O.status_of(out)
        events = []
        if answer.reasoning is not None or self.reasoning.index is not None:
            events += self._close(self.reasoning, answer.reasoning or "", O.reasoning_status(answer, status),
                                  force=True)
        if O.has_message(answer) or self.message.index is not None:
            events += self._close(self.message, answer.content or "", status, force=True)
        for call in answer.calls:
            events += self._call(O.call_item(call))
        body = self.fmt.finish(out, prompt_tokens, self.items)
        kind = "response.completed" if body["status"] == "completed" else "response.incomplete"
        return events + [self.ev(kind, response=body)]

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
    writer = _Writer(job.fmt, job.reasoning_modes[0] if job.reasoning_modes else None)
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
