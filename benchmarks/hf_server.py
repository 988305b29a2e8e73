"""External baseline: Hugging Face transformers ``generate`` behind a minimal OpenAI-style
streaming ``/v1/completions`` (FastAPI). Not part of the jaxinfer package.

Static batching, the way a plain transformers deployment serves: requests queue until
``--max-batch-size`` of them wait or the oldest has waited ``--batch-timeout-s``; the batch
is left-padded and run through one ``model.generate`` call (greedy unless a temperature
is given) until its longest member is done; only then does the next batch start. Tokens
stream out per request through a batch-aware ``BaseStreamer``. Same model as jaxinfer's
default: SmolLM2-135M-Instruct from the GGUF in ``weights/.download`` (dequantized to
float32 by transformers; needs ``accelerate``).

Usage: python benchmarks/hf_server.py --port 8001 [--max-batch-size 32] [--batch-timeout-s 0.1]
Endpoints: POST /v1/completions (prompt: text or token ids; max_tokens, ignore_eos,
temperature, stream, stream_options.include_usage), GET /v1/models, GET /health.
A full queue answers 429 with Retry-After.
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import contextlib
import logging
import time
import uuid
from pathlib import Path

import torch
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

ROOT = Path(__file__).resolve().parents[1]
logger = logging.getLogger("hf_server")


@dataclasses.dataclass
class Job:
    """One request in flight: its prompt, limits and the queue its stream reads."""

    prompt_ids: list[int]
    max_tokens: int
    ignore_eos: bool
    temperature: float
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue
    tokens: list[int] = dataclasses.field(default_factory=list)
    text: str = ""
    done: bool = False
    cancelled: bool = False


class BatchStreamer:
    """transformers streamer for a whole batch: ``put`` gets the prompt ids first, then a
    [B] tensor of new tokens per step. Hands each job its text delta (via the event loop)
    and finishes it at ``max_tokens`` or EOS."""

    def __init__(self, jobs: list[Job], tokenizer, eos_ids: set[int]):
        self.jobs, self.tokenizer, self.eos_ids = jobs, tokenizer, eos_ids
        self.seen_prompt = False

    def put(self, value: torch.Tensor) -> None:
        if not self.seen_prompt:
            self.seen_prompt = True
            return
        for job, tok in zip(self.jobs, value.reshape(-1).tolist()):
            if job.done:
                continue
            job.tokens.append(tok)
            finish = None
            if not job.ignore_eos and tok in self.eos_ids:
                finish = "stop"
            elif len(job.tokens) >= job.max_tokens:
                finish = "length"
            text = self.tokenizer.decode(job.tokens, skip_special_tokens=True)
            delta, job.text = text[len(job.text):], text
            job.done = finish is not None
            job.loop.call_soon_threadsafe(job.queue.put_nowait, (delta, finish))

    def end(self) -> None:
        for job in self.jobs:
            if not job.done:
                job.done = True
                job.loop.call_soon_threadsafe(job.queue.put_nowait, ("", "length"))


class AllDone:
    """Stopping criterion: stop the batch once every member finished or left."""

    def __init__(self, jobs: list[Job]):
        self.jobs = jobs

    def __call__(self, input_ids, scores, **kwargs) -> torch.Tensor:
        done = all(j.done or j.cancelled for j in self.jobs)
        return torch.full((input_ids.shape[0],), done, dtype=torch.bool)


class StaticBatcher:
    """Collects jobs into static batches and runs each through ``model.generate`` in a thread."""

    def __init__(self, model, tokenizer, max_batch_size: int, batch_timeout_s: float, max_queue_len: int):
        self.model, self.tokenizer = model, tokenizer
        self.max_batch_size, self.batch_timeout_s, self.max_queue_len = max_batch_size, batch_timeout_s, max_queue_len
        self.queue: asyncio.Queue[Job] = asyncio.Queue()
        self.eos_ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.num_batches = 0

    async def loop(self) -> None:
        """Forever: wait for a first job, fill the batch until full or timed out, run it."""
        aio = asyncio.get_running_loop()
        while True:
            batch = [await self.queue.get()]
            deadline = aio.time() + self.batch_timeout_s
            while len(batch) < self.max_batch_size:
                try:
                    batch.append(await asyncio.wait_for(self.queue.get(), max(0.0, deadline - aio.time())))
                except TimeoutError:
                    break
            batch = [j for j in batch if not j.cancelled]
            if batch:
                await asyncio.to_thread(self.generate, batch)

    def generate(self, jobs: list[Job]) -> None:
        """One static batch: left-padded prompts, one ``generate`` call (runs in a worker thread)."""
        from transformers import GenerationConfig, StoppingCriteriaList

        width = max(len(j.prompt_ids) for j in jobs)
        ids = torch.tensor([[self.pad_id] * (width - len(j.prompt_ids)) + j.prompt_ids for j in jobs])
        mask = torch.tensor([[0] * (width - len(j.prompt_ids)) + [1] * len(j.prompt_ids) for j in jobs])
        temp = max(j.temperature for j in jobs)
        gen = GenerationConfig(max_new_tokens=max(j.max_tokens for j in jobs), do_sample=temp > 0,
                               temperature=temp if temp > 0 else None, top_p=None, top_k=None,
                               eos_token_id=None, pad_token_id=self.pad_id)
        self.num_batches += 1
        try:
            with torch.inference_mode():
                self.model.generate(input_ids=ids, attention_mask=mask, generation_config=gen,
                                    streamer=BatchStreamer(jobs, self.tokenizer, self.eos_ids),
                                    stopping_criteria=StoppingCriteriaList([AllDone(jobs)]))
        except Exception as exc:  # report to every member instead of dying silently
            logger.exception("generate failed")
            for j in jobs:
                if not j.done:
                    j.done = True
                    j.loop.call_soon_threadsafe(j.queue.put_nowait, (exc, None))


def load_model(gguf: Path | None, threads: int | None):
    """(model, tokenizer) from the default GGUF, dequantized to float32."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if gguf is None:
        from jaxinfer.weights.catalog import default_gguf

        gguf = default_gguf(ROOT / "weights")
    if threads:
        torch.set_num_threads(threads)
    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    logger.info("loaded %s in %.1f s (torch %s, %d threads)", gguf.name, time.perf_counter() - t0,
                torch.__version__, torch.get_num_threads())
    return model, tok


def create_app(batcher: StaticBatcher, served_name: str) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app):
        task = asyncio.create_task(batcher.loop())
        yield
        task.cancel()

    app = FastAPI(title="transformers static-batching baseline", lifespan=lifespan)

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": served_name, "object": "model", "owned_by": "transformers"}]}

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await request.json()
        prompt = body.get("prompt")
        ids = prompt if isinstance(prompt, list) else batcher.tokenizer.encode(prompt, add_special_tokens=False)
        if not ids or not all(isinstance(t, int) for t in ids):
            return JSONResponse({"error": {"message": "prompt must be a string or a list of token ids",
                                           "type": "invalid_request_error"}}, status_code=400)
        if batcher.queue.qsize() >= batcher.max_queue_len:
            return JSONResponse({"error": {"message": "queue full", "type": "rate_limit_error"}}, status_code=429,
                                headers={"Retry-After": "1"})
        job = Job(list(ids), int(body.get("max_tokens") or 16), bool(body.get("ignore_eos")),
                  float(body.get("temperature") or 0.0), asyncio.get_running_loop(), asyncio.Queue())
        batcher.queue.put_nowait(job)
        cid = f"cmpl-{uuid.uuid4().hex[:12]}"
        usage = (body.get("stream_options") or {}).get("include_usage")
        if body.get("stream"):
            return StreamingResponse(_sse(job, cid, served_name, bool(usage), request), media_type="text/event-stream")
        text, finish = "", None
        while finish is None:
            delta, finish = await job.queue.get()
            if isinstance(delta, Exception):
                return JSONResponse({"error": {"message": str(delta), "type": "server_error"}}, status_code=500)
            text += delta
        return {"id": cid, "object": "text_completion", "model": served_name,
                "choices": [{"index": 0, "text": text, "finish_reason": finish}],
                "usage": _usage(job)}

    return app


def _usage(job: Job) -> dict:
    n_in, n_out = len(job.prompt_ids), len(job.tokens)
    return {"prompt_tokens": n_in, "completion_tokens": n_out, "total_tokens": n_in + n_out}


async def _sse(job: Job, cid: str, model: str, include_usage: bool, request: Request):
    """OpenAI ``text_completion`` chunks, a usage chunk, ``[DONE]``; a client that leaves is
    marked cancelled (its batch still runs: static batching cannot drop a member)."""
    base = {"id": cid, "object": "text_completion", "created": int(time.time()), "model": model}
    try:
        finish = None
        while finish is None:
            delta, finish = await job.queue.get()
            if isinstance(delta, Exception):
                yield f"data: {json.dumps({'error': {'message': str(delta), 'type': 'server_error'}})}\n\n"
                break
            if delta or finish:
                choice = {"index": 0, "text": delta, "finish_reason": finish}
                yield f"data: {json.dumps({**base, 'choices': [choice]})}\n\n"
        if include_usage:
            yield f"data: {json.dumps({**base, 'choices': [], 'usage': _usage(job)})}\n\n"
        yield "data: [DONE]\n\n"
    finally:
        job.cancelled = not job.done


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8001)
    p.add_argument("--gguf", type=Path, default=None, help="default: the SmolLM2 GGUF in weights/.download")
    p.add_argument("--served-model-name", default="smollm2-135m-instruct")
    p.add_argument("--max-batch-size", type=int, default=32)
    p.add_argument("--batch-timeout-s", type=float, default=0.1)
    p.add_argument("--max-queue-len", type=int, default=256)
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    args = p.parse_args(argv)
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    import uvicorn

    model, tok = load_model(args.gguf, args.threads)
    batcher = StaticBatcher(model, tok, args.max_batch_size, args.batch_timeout_s, args.max_queue_len)
    uvicorn.run(create_app(batcher, args.served_model_name), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
