"""Response bodies and stream chunks built from engine outputs, per endpoint.

`CompletionFormat` and `ChatFormat` share one interface: ``response`` (the whole JSON
answer), ``first_chunks`` (chat's role announcements), ``delta_chunk`` (what a choice
gained since the last chunk: text difference, its tokens' logprobs, finish reason) and
``usage_chunk``. Deltas are differences of the engine's cumulative ``text``, which never
shrinks, so streamed text concatenated equals the non-streamed text (SC-10).

With a reasoning parser (``--reasoning-parser``, `jaxinfer.reasoning`) a chat answer is
first split into ``reasoning_content`` / ``reasoning`` (both names, as vLLM) and the
content; streamed, a `jaxinfer.reasoning.ReasoningStream` per choice sends
``delta.reasoning_content`` / ``delta.reasoning`` and holds back only a tail that may be
the start of ``</think>``.

A chat request with tools (``tool_choice`` not ``none``) has its content parsed for
tool-call blocks (`jaxinfer.structured_outputs.tool_calls`): calls become ``message.tool_calls`` with
``finish_reason: "tool_calls"`` (``"length"`` when ``max_tokens`` cut the answer: complete
calls are kept, a cut one is dropped and never shown as content). Streamed, the content
before the first call block streams as text (a tail that may become ``<tool_call>`` and
trailing whitespace held back); the calls are sent at the end as one ``delta.tool_calls``
chunk (each call's id, name and whole arguments) with the finish reason. Streamed
content concatenated equals the non-streamed content.

``usage`` on a chunk: passed in by the caller (``stream_options.continuous_usage_stats``).
"""
from __future__ import annotations

import dataclasses

from jaxinfer.reasoning import ReasoningParser, ReasoningStream
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
    reasoning: ReasoningStream | None = None  # chat with a reasoning parser
    content: str = ""  # chat content sent so far (with a reasoning parser or tools)


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

    def first_chunks(self, num_choices: int, usages: list[P.Usage] | None = None) -> list[str]:
        return []

    def delta_chunk(self, index: int, out: RequestOutput, cur: ChoiceCursor,
                    usage: P.Usage | None = None) -> str | None:
        """The chunk for what choice ``index`` gained since ``cur`` (updated), or None if
        nothing; ``usage`` rides on it when given."""
        comp = out.outputs[0]
        text = comp.text[cur.text_len:]
        token_ids = comp.token_ids[cur.num_tokens:]
        finish = comp.finish_reason if comp.finish_reason in ("stop", "length") else None
        if not text and not finish and not (token_ids and self.logprobs is not None):
            return None
        entries = (comp.logprobs or [])[cur.num_tokens:] if self.logprobs is not None else None
        chunk = self._chunk(index, text, token_ids, entries, finish, cur)
        chunk.usage = usage
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

    Args (besides `_Format`'s):
      parse_tools: tools were offered, so answers are parsed for tool calls.
      max_calls: keep at most this many calls (``parallel_tool_calls: false``: 1), or None.
      reasoning: the `ReasoningParser` (``--reasoning-parser``), or None.
      reasoning_mode: the mode each output starts in (`ReasoningParser.start_mode`).
      include_reasoning: False drops the reasoning from the answer (vLLM's ``include_reasoning``).
    """

    def __init__(self, *args, parse_tools: bool = False, max_calls: int | None = None,
                 reasoning: ReasoningParser | None = None, reasoning_mode: str | None = None,
                 include_reasoning: bool = True):
        super().__init__(*args)
        self.parse_tools = parse_tools
        self.max_calls = max_calls
        self.reasoning = reasoning
        self.reasoning_mode = reasoning_mode
        self.include_reasoning = include_reasoning

    def _message(self, comp) -> tuple[P.AssistantMessage, str | None]:
        """The message and finish reason of a finished choice (reasoning and tool calls parsed out)."""
        reasoning, content = (self.reasoning.split(comp.text, self.reasoning_mode) if self.reasoning is not None
                              else (None, comp.text))
        calls = []
        if self.parse_tools:
            parsed, calls = tool_calls.parse(content or "", truncated=comp.finish_reason == "length")
            calls = calls[:self.max_calls] if self.max_calls is not None else calls
            if calls or parsed != (content or None):  # calls, or a cut call dropped
                content = parsed
        finish = "tool_calls" if calls and comp.finish_reason == "stop" else comp.finish_reason
        reasoning = reasoning if self.include_reasoning else None
        return P.AssistantMessage(content=content, reasoning_content=reasoning, reasoning=reasoning,
                                  tool_calls=calls or None), finish

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

    def first_chunks(self, num_choices: int, usages: list[P.Usage] | None = None) -> list[str]:
        """One ``delta: {role: assistant, content: ""}`` chunk per choice, sent first."""
        return [P.ChatCompletionChunk(id=self.id, created=self.created, model=self.model, choices=[
            P.ChatChunkChoice(index=i, delta=P.DeltaMessage(role="assistant", content=""))],
            usage=usages[i] if usages else None).model_dump_json() for i in range(num_choices)]

    def delta_chunk(self, index: int, out: RequestOutput, cur: ChoiceCursor,
                    usage: P.Usage | None = None) -> str | None:
        """As `_Format.delta_chunk`; with a reasoning parser or tools, the reasoning and the
        content stream apart (each holding back what may still change class) and a finished
        answer's calls come as one ``tool_calls`` delta."""
        if not self.parse_tools and self.reasoning is None:
            return super().delta_chunk(index, out, cur, usage)
        comp = out.outputs[0]
        if cur.finished:
            return None
        finish = comp.finish_reason if comp.finish_reason in ("stop", "length") else None
        reasoning, content = self._stream_parts(comp, cur, finish is not None)
        calls = None
        if finish is not None and self.parse_tools:
            message, finish = self._message(comp)
            content, calls = message.content or "", message.tool_calls
        delta_content = content[len(cur.content):] if content.startswith(cur.content) else ""
        if not (reasoning or delta_content or calls or finish):
            return None
        entries = (comp.logprobs or [])[cur.num_tokens:] if self.logprobs is not None else None
        logprobs = (lp.chat_logprobs(comp.token_ids[cur.num_tokens:], entries, self.logprobs, self.tokenizer)
                    if entries is not None else None)
        deltas = [P.DeltaToolCall(index=k, id=c.id, type="function",
                                  function=P.DeltaFunction(name=c.function.name, arguments=c.function.arguments))
                  for k, c in enumerate(calls or [])]
        delta = P.DeltaMessage(content=delta_content or None, reasoning_content=reasoning or None,
                               reasoning=reasoning or None, tool_calls=deltas or None)
        cur.content += delta_content
        cur.text_len, cur.num_tokens, cur.finished = len(comp.text), len(comp.token_ids), finish is not None
        return P.ChatCompletionChunk(id=self.id, created=self.created, model=self.model, usage=usage, choices=[
            P.ChatChunkChoice(index=index, delta=delta, logprobs=logprobs, finish_reason=finish)]).model_dump_json()

    def _stream_parts(self, comp, cur: ChoiceCursor, final: bool) -> tuple[str, str]:
        """(the reasoning gained since the last chunk, the content that may stream so far)."""
        if self.reasoning is None:
            reasoning, answer = "", comp.text
        else:
            if cur.reasoning is None:
                cur.reasoning = ReasoningStream(self.reasoning, self.reasoning_mode)
            reasoning, _ = cur.reasoning.update(comp.text, final=final)
            answer = cur.reasoning.content
            reasoning = reasoning if self.include_reasoning else ""
        return reasoning, (tool_calls.stable_content(answer) if self.parse_tools and not final else answer)

    def _chunk(self, index, text, token_ids, entries, finish, cur):
        logprobs = (lp.chat_logprobs(token_ids, entries, self.logprobs, self.tokenizer)
                    if entries is not None else None)
        choice = P.ChatChunkChoice(index=index, delta=P.DeltaMessage(content=text), logprobs=logprobs,
                                   finish_reason=finish)
        return P.ChatCompletionChunk(id=self.id, created=self.created, model=self.model, choices=[choice])

    def usage_chunk(self, usage_: P.Usage) -> str:
        return P.ChatCompletionChunk(id=self.id, created=self.created, model=self.model, choices=[],
                                     usage=usage_).model_dump_json()
