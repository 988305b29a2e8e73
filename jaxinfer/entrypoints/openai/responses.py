"""Response bodies and stream chunks built from engine outputs, per endpoint.

`CompletionFormat` and `ChatFormat` share one interface: ``response`` (the whole JSON
answer), ``first_chunks`` (chat's role announcements), ``delta_chunk`` (what a choice
gained since the last chunk: text difference, its tokens' logprobs, finish reason) and
``usage_chunk``. Deltas are differences of the engine's cumulative ``text``, which never
shrinks, so streamed text concatenated equals the non-streamed text (SC-10).

A chat request with tools (``tool_choice`` not ``none``) has its answer parsed for
tool-call blocks (`jaxinfer.structured_outputs.tool_calls`): calls become ``message.tool_calls`` with
``finish_reason: "tool_calls"``. Streamed, an answer that starts as a call block is held
back until it ends, then sent as one ``delta.tool_calls`` chunk (each call's id, name and
whole arguments) with the finish reason; any other answer streams as text.
"""
from __future__ import annotations

import dataclasses

from jaxinfer.structured_outputs import tool_calls
from jaxinfer.entrypoints.openai import logprobs as lp
from jaxinfer.entrypoints.openai import protocol as P
from jaxinfer.outputs import RequestOutput


@dataclasses.dataclass
class ChoiceCursor:
    """How much of one choice a stream has sent."""

    text_len: int = 0
    num_tokens: int = 0
    text_offsets: lp.TextOffsets = dataclasses.field(default_factory=lp.TextOffsets)  # legacy ``text_offset``
    finished: bool = False
    plain_text: bool = False  # tools offered: the answer is known not to start with a call block


def usage(prompt_lengths: list[int], outputs: list[RequestOutput]) -> P.Usage:
    """Prompt tokens once per prompt (not per choice); completion tokens over all choices (EOS
    counted); cached tokens = prefix-cache hits of each prompt's first choice.

    Args:
      prompt_lengths: token count of each prompt, in order.
      outputs: final outputs in choice order (``n`` consecutive choices per prompt).
    """
    prompt = sum(prompt_lengths)
    completion = sum(len(o.outputs[0].token_ids) for o in outputs)
    n = len(outputs) // max(1, len(prompt_lengths))
    cached = sum(outputs[i].num_cached_tokens for i in range(0, len(outputs), max(1, n)))
    return P.Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion,
                   prompt_tokens_details=P.PromptTokensDetails(cached_tokens=cached))


class _Format:
    def __init__(self, response_id: str, model: str, created: int, logprobs: int | None, tokenizer):
        self.id = response_id
        self.model = model
        self.created = created
        self.logprobs = logprobs
        self.tokenizer = tokenizer

    def first_chunks(self, num_choices: int) -> list[str]:
        return []

    def delta_chunk(self, index: int, out: RequestOutput, cur: ChoiceCursor) -> str | None:
        """The chunk for what choice ``index`` gained since ``cur`` (updated), or None if nothing."""
        comp = out.outputs[0]
        text = comp.text[cur.text_len:]
        token_ids = comp.token_ids[cur.num_tokens:]
        finish = comp.finish_reason if comp.finish_reason in ("stop", "length") else None
        if not text and not finish and not (token_ids and self.logprobs is not None):
            return None
        entries = (comp.logprobs or [])[cur.num_tokens:] if self.logprobs is not None else None
        chunk = self._chunk(index, text, token_ids, entries, finish, cur)
        cur.text_len, cur.num_tokens = len(comp.text), len(comp.token_ids)
        cur.finished = finish is not None
        return chunk.model_dump_json()

    def usage_chunk(self, usage_: P.Usage) -> str:
        raise NotImplementedError

    def _chunk(self, index, text, token_ids, entries, finish, cur):
        raise NotImplementedError


class CompletionFormat(_Format):
    """``/v1/completions``: ``text_completion`` objects.

    ``echo``: each choice's text and logprobs start with its prompt (text as given, or
    the token ids decoded; logprobs from the engine's prompt logprobs). ``echo_only``
    (``max_tokens: 0``): the one generated token is left out (text, logprobs, usage) and
    the finish reason is ``length``. Streams never echo (refused at the request).
    """

    def __init__(self, *args, echo: bool = False, echo_only: bool = False):
        super().__init__(*args)
        self.echo = echo
        self.echo_only = echo_only

    def response(self, outputs: list[RequestOutput], prompt_lengths: list[int]) -> dict:
        if self.echo_only:
            outputs = [_without_generation(o) for o in outputs]
        choices = []
        for i, out in enumerate(outputs):
            comp = out.outputs[0]
            logprobs = (lp.completion_logprobs(comp.token_ids, comp.logprobs or [], tokenizer=self.tokenizer)
                        if self.logprobs is not None else None)
            text = comp.text
            if self.echo:
                text = self._prompt_text(out) + text
                if logprobs is not None:
                    logprobs = lp.echo_logprobs(out.prompt_token_ids, out.prompt_logprobs or [], self.tokenizer,
                                                logprobs)
            choices.append(P.CompletionChoice(index=i, text=text, logprobs=logprobs,
                                              finish_reason=comp.finish_reason))
        body = P.CompletionResponse(id=self.id, created=self.created, model=self.model, choices=choices,
                                    usage=usage(prompt_lengths, outputs))
        return body.model_dump()

    def _prompt_text(self, out: RequestOutput) -> str:
        if out.prompt is not None:
            return out.prompt
        if self.tokenizer is None:
            return ""
        return self.tokenizer.decode(out.prompt_token_ids, skip_special_tokens=False)

    def _chunk(self, index, text, token_ids, entries, finish, cur):
        logprobs = None
        if entries is not None:
            logprobs = lp.completion_logprobs(token_ids, entries, cur.text_offsets, self.tokenizer)
        choice = P.CompletionChoice(index=index, text=text, logprobs=logprobs, finish_reason=finish)
        return P.CompletionChunk(id=self.id, created=self.created, model=self.model, choices=[choice])

    def usage_chunk(self, usage_: P.Usage) -> str:
        return P.CompletionChunk(id=self.id, created=self.created, model=self.model, choices=[],
                                 usage=usage_).model_dump_json()


def _without_generation(out: RequestOutput) -> RequestOutput:
    """``out`` as if nothing had been generated (``echo`` with ``max_tokens: 0``)."""
    comp = out.outputs[0]
    empty = dataclasses.replace(comp, text="", token_ids=[], logprobs=[] if comp.logprobs is not None else None,
                                finish_reason="length", stop_reason=None)
    return dataclasses.replace(out, outputs=[empty])


class ChatFormat(_Format):
    """``/v1/chat/completions``: ``chat.completion`` / ``chat.completion.chunk`` objects.

    ``parse_tools``: tools were offered, so answers are parsed for tool calls.
    """

    def __init__(self, *args, parse_tools: bool = False):
        super().__init__(*args)
        self.parse_tools = parse_tools

    def _message(self, comp) -> tuple[P.AssistantMessage, str | None]:
        """The message and finish reason of a finished choice (tool calls parsed out)."""
        if self.parse_tools:
            content, calls = tool_calls.parse(comp.text)
            if calls:
                finish = "tool_calls" if comp.finish_reason == "stop" else comp.finish_reason
                return P.AssistantMessage(content=content, tool_calls=calls), finish
        return P.AssistantMessage(content=comp.text), comp.finish_reason

    def response(self, outputs: list[RequestOutput], prompt_lengths: list[int]) -> dict:
        choices = []
        for i, out in enumerate(outputs):
            comp = out.outputs[0]
            logprobs = (lp.chat_logprobs(comp.token_ids, comp.logprobs or [], self.logprobs, self.tokenizer)
                        if self.logprobs is not None else None)
            message, finish = self._message(comp)
            choices.append(P.ChatChoice(index=i, message=message, logprobs=logprobs, finish_reason=finish))
        body = P.ChatCompletionResponse(id=self.id, created=self.created, model=self.model, choices=choices,
                                        usage=usage(prompt_lengths, outputs))
        return body.model_dump()

    def first_chunks(self, num_choices: int) -> list[str]:
        """One ``delta: {role: assistant, content: ""}`` chunk per choice, sent first."""
        return [P.ChatCompletionChunk(id=self.id, created=self.created, model=self.model, choices=[
            P.ChatChunkChoice(index=i, delta=P.DeltaMessage(role="assistant", content=""))]).model_dump_json()
            for i in range(num_choices)]

    def delta_chunk(self, index: int, out: RequestOutput, cur: ChoiceCursor) -> str | None:
        """As `_Format.delta_chunk`; with tools, an answer that may be a call block is held
        back, and a finished one that is becomes a ``tool_calls`` delta."""
        comp = out.outputs[0]
        if not self.parse_tools or cur.plain_text:
            return super().delta_chunk(index, out, cur)
        if comp.finish_reason is None and tool_calls.may_become_call(comp.text):
            return None
        message, finish = self._message(comp) if comp.finish_reason is not None else (None, None)
        if message is None or not message.tool_calls:
            cur.plain_text = True
            return super().delta_chunk(index, out, cur)
        calls = [P.DeltaToolCall(index=k, id=c.id, type="function",
                                 function=P.DeltaFunction(name=c.function.name, arguments=c.function.arguments))
                 for k, c in enumerate(message.tool_calls)]
        entries = (comp.logprobs or [])[cur.num_tokens:] if self.logprobs is not None else None
        logprobs = (lp.chat_logprobs(comp.token_ids[cur.num_tokens:], entries, self.logprobs, self.tokenizer)
                    if entries is not None else None)
        delta = P.DeltaMessage(content=message.content, tool_calls=calls)
        cur.text_len, cur.num_tokens, cur.finished = len(comp.text), len(comp.token_ids), True
        return P.ChatCompletionChunk(id=self.id, created=self.created, model=self.model, choices=[
            P.ChatChunkChoice(index=index, delta=delta, logprobs=logprobs, finish_reason=finish)]).model_dump_json()

    def _chunk(self, index, text, token_ids, entries, finish, cur):
        logprobs = (lp.chat_logprobs(token_ids, entries, self.logprobs, self.tokenizer)
                    if entries is not None else None)
        choice = P.ChatChunkChoice(index=index, delta=P.DeltaMessage(content=text), logprobs=logprobs,
                                   finish_reason=finish)
        return P.ChatCompletionChunk(id=self.id, created=self.created, model=self.model, choices=[choice])

    def usage_chunk(self, usage_: P.Usage) -> str:
        return P.ChatCompletionChunk(id=self.id, created=self.created, model=self.model, choices=[],
                                     usage=usage_).model_dump_json()
