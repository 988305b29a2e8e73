"""A fake runner that writes a scripted answer, within the structured-output mask.

`ScriptedRunner.script` is ``(prompt_len, token_ids)``: a row whose last token sits at
position ``prompt_len - 1 + k`` emits ``token_ids[k]`` (EOS past the end). When the step's
bitmask forbids that token (a grammar is on), the row emits EOS if allowed, else the
smallest allowed id, as a sampler under the mask would pick something allowed: so a
script that a constraint admits comes back verbatim, and one it refuses does not.
Without a script it is `FakeRunner` (next token = last + 1). `Server` puts one behind an
app (with a reasoning parser and chat template of choice); `streamed` reassembles a chat
stream.
"""
from __future__ import annotations

import numpy as np

from fastapi.testclient import TestClient

from api_helpers import MODEL, V, model_config, running_app, sse_json, tokenizer
from fakes import FakeRunner
from jaxinfer.config import CacheConfig, EngineConfig, SchedulerConfig
from jaxinfer.engine.llm_engine import LLMEngine

EOS = 2


def allowed(words: np.ndarray, token: int) -> bool:
    """Whether bit ``token`` of one bitmask row ([W] int32) is set."""
    return bool((int(words[token // 32]) >> (token % 32)) & 1)


class ScriptedRunner(FakeRunner):
    def __init__(self, vocab_size: int, eos: int = EOS, step_delay: float = 0.0):
        super().__init__(vocab_size, step_delay=step_delay)
        self.eos = eos
        self.script: tuple[int, list[int]] | None = None

    def execute(self, inputs) -> dict[str, np.ndarray]:
        out = super().execute(inputs)
        if self.script is None:
            return out
        prompt_len, ids = self.script
        rows = inputs.attention.logits_indices
        positions = np.asarray(inputs.attention.positions)[rows]
        mask = inputs.sampling.bitmask
        for r, pos in enumerate(positions):
            k = int(pos) - (prompt_len - 1)
            want = ids[k] if 0 <= k < len(ids) else self.eos
            if mask is not None and not allowed(mask[r], want):
                free = np.flatnonzero(np.unpackbits(np.asarray(mask[r]).view(np.uint8), bitorder="little"))
                want = self.eos if allowed(mask[r], self.eos) else int(free[0])
            out["token_ids"][r] = want
        return out


class Server:
    """One fake engine with a reasoning parser, its app and its scripted runner."""

    def __init__(self, parser: str | None, template: str | None = None):
        tok = tokenizer() if template is None else tokenizer().with_chat_template(template)
        self.tok = tok
        self.runner = ScriptedRunner(V, step_delay=0.003)  # a step per stream batch: deltas token by token
        config = EngineConfig(model_path="fake", reasoning_parser=parser, scheduler=SchedulerConfig(
            max_num_seqs=8, max_num_batched_tokens=128, max_model_len=1024, max_queue_len=64),
            cache=CacheConfig(num_blocks=769))
        self.engine = LLMEngine(config, model_config(), self.runner, 769, tok)

    def __enter__(self):
        self._ctx = running_app(self.engine)
        app, ae = self._ctx.__enter__()
        self.http = TestClient(app, raise_server_exceptions=False)
        self.added = []  # the prompt ids of every engine request, as added
        add = ae.add

        async def recording_add(specs):
            self.added += [list(s.prompt_token_ids) for s in specs]
            return await add(specs)
        ae.add = recording_add
        return self

    def __exit__(self, *exc):
        self._ctx.__exit__(*exc)

    def script(self, messages, pieces, **fields) -> list[int]:
        """Script the answer to ``messages`` as the token ids of ``pieces`` (each piece encoded
        on its own, so a piece boundary is a token boundary)."""
        r = self.http.post("/tokenize", json={"model": MODEL, "messages": messages, **fields})
        assert r.status_code == 200, r.text
        ids = [t for p in pieces for t in self.tok.encode(p, add_special_tokens=False)]
        self.runner.script = (len(r.json()["tokens"]), ids)
        return ids

    def chat(self, pieces, messages=None, stream=False, **fields):
        messages = messages or [{"role": "user", "content": "What is 2 + 2?"}]
        template_fields = {k: fields[k] for k in ("tools", "tool_choice", "chat_template_kwargs") if k in fields}
        self.script(messages, pieces, **template_fields)
        r = self.http.post("/v1/chat/completions", json={"model": MODEL, "messages": messages, "max_tokens": 64,
                                                         "stream": stream, **fields})
        assert r.status_code == 200, r.text
        return sse_json(r.content) if stream else r.json()


def streamed(events, index: int = 0) -> dict:
    """The streamed choice ``index`` reassembled: reasoning, content, tool calls, finish reason."""
    out = {"reasoning_content": "", "reasoning": "", "content": "", "calls": [], "finish": None, "pieces": []}
    for e in events:
        for c in e["choices"]:
            if c["index"] != index:
                continue
            d = c["delta"]
            assert d.get("reasoning") == d.get("reasoning_content")  # the two names carry the same text
            out["pieces"].append(d.get("reasoning_content"))
            for k in ("reasoning_content", "reasoning", "content"):
                out[k] += d.get(k) or ""
            out["calls"] += d.get("tool_calls") or []
            out["finish"] = c["finish_reason"] or out["finish"]
    return out
