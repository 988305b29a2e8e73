"""`LLM`: the offline API in vLLM's shape (``from jaxinfer import LLM, SamplingParams``).

Builds an engine, submits a batch of prompts, steps until all finish (with a tqdm bar
counting prompts, each done when all its ``n`` sequences are),
and returns one `RequestOutput` per prompt in input order. ``n > 1`` fans out into
independent engine requests (seeds ``seed + i``) merged back into one output. With
``runner="pooling"`` (vLLM's), `LLM.embed` returns one `EmbeddingRequestOutput` per prompt
(`LLM.encode`: `PoolingRequestOutput`) and ``generate`` / ``chat`` refuse, as in vLLM.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Sequence

from tqdm.auto import tqdm

from jaxinfer.tokenizer import chat
from jaxinfer.engine.builder import build_engine
from jaxinfer.config import EngineConfig, ParallelConfig
from jaxinfer.config.args import DEFAULT_MODEL, engine_config, llm_defaults, llm_namespace
from jaxinfer.engine.protocol import RequestSpec
from jaxinfer.errors import RequestError
from jaxinfer.outputs import EmbeddingRequestOutput, PoolingRequestOutput, RequestOutput
from jaxinfer.pooling_params import PoolingParams
from jaxinfer.outputs import RequestOutput
from jaxinfer.reasoning import PROMPT_TAIL_TOKENS, get_parser
from jaxinfer.sampling_params import SamplingParams, choice_seed, is_integer
from jaxinfer.spec_decode import SpeculativeConfig

_D = llm_defaults()  # the keywords' defaults are server.py's flags' (jaxinfer.config.args.FLAGS)
OFFLINE_MAX_QUEUE_LEN = 1 << 30  # offline, every prompt of a call is queued at once (server.py: --max-queue-len)


class LLM:
    """Offline generation.

    Every keyword that is also a ``server.py`` flag takes that flag's default and meaning
    (`jaxinfer.config.args.FLAGS`), except ``max_queue_len`` (`OFFLINE_MAX_QUEUE_LEN`: a
    call queues all its prompts at once).

    Args:
      model: a name under ``weights/`` (prepared on first use) or a path to a converted
        folder or a Hugging Face checkpoint folder.
      dtype: "auto" (bfloat16 on GPU/TPU and on CPUs with AVX-512 BF16 or AMX, else float32; `jaxinfer.platform.dtype.auto_dtype`, logged), "float32" or "bfloat16".
      tokenizer: a folder (or a model name under ``weights/``) to take the tokenizer and
        chat template from instead of the model's folder (or, with ``model_config``, a
        `jaxinfer.tokenizer.tokenizer.Tokenizer` to use as is).
      chat_template: a chat template for `chat`, replacing the tokenizer's: a file, a bundled
        name (``"gemma3"``) or Jinja text (`jaxinfer.tokenizer.templates.load_chat_template`; vLLM's
        ``chat_template``). Models without a template (pretrained base models such as
        ``gemma3-270m``) need one for `chat`.
      max_model_len: prompt + output limit (default min(4096, the model's context)).
      max_num_seqs, max_num_batched_tokens: scheduler limits.
      kv_cache_memory: KV budget in bytes; num_blocks: explicit pool size (overrides).
      gpu_memory_utilization: fraction of device memory for weights, activations and KV
        (default 0.9; does not apply on CPU). block_size: tokens per KV block (16).
      watermark: fraction of blocks kept free at admission.
      enable_prefix_caching: reuse KV blocks of shared prompt prefixes.
      attention_backend: "xla" or "pallas" (default: pallas on GPU, xla otherwise).
      warmup: compile every bucket at start-up.
      use_tqdm: show the warm-up's progress bar (generate takes its own ``use_tqdm``).
      load_format: "auto" or "dummy" (random weights).
      tensor_parallel_size, data_parallel_size: devices per replica and replicas
        (`ParallelConfig`, `jaxinfer.distributed.sharding`); generate works the same with any.
      enable_expert_parallel: a mixture-of-experts model's experts split over the replica's
        devices (vLLM's name); expert_parallel_size: over how many of them (dividing
        tensor_parallel_size; default all), each expert's width split over the rest.
      scheduler: "continuous" (default) or "static", the static-batching baseline
        (`jaxinfer.core.sched.static`), for side-by-side measurements.
      scheduling_policy: "fcfs" or "priority" (``SamplingParams.priority`` / ``generate``'s
        ``priority``, lower first); priority_aging_s: seconds of waiting that lower the
        effective priority by 1 (`jaxinfer.core.sched.priority`).
      quantization: None or "int8": int8 weights with group scales (one per 64 inputs of an output channel), made
        from the float checkpoint as it loads (`jaxinfer.layers.quantization.int8`; vLLM's ``quantization``).
      kv_cache_dtype: "auto", "int8" or "fp8": 8-bit K/V with per-token scales
        (`jaxinfer.layers.attention.kv_quant`; vLLM's ``kv_cache_dtype``).
      speculative_config: speculative decoding, as vLLM's: a dict (or JSON string) such as
        ``{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4,
        "prompt_lookup_min": 2}`` (`jaxinfer.spec_decode.SpeculativeConfig`); None = off.
      runner: "generate" (default) or "pooling": `embed` / `encode` from the final hidden states
        (prefill only; vLLM's ``runner``); pooling_type: "last" (default) or "mean"
        (`jaxinfer.core.pooling`).
      reasoning_parser: None, ``"qwen3"`` or ``"deepseek_r1"`` (vLLM's names, `jaxinfer.reasoning`):
        structured outputs apply to the answer after the ``<think>...</think>`` reasoning
        (outputs keep the reasoning in their text, as vLLM's ``LLM`` does).
      engine_kwargs: model_config/params/tokenizer to skip loading (tests).
    """

    def __init__(self, model: str = DEFAULT_MODEL, dtype: str = _D["dtype"], *, max_model_len: int | None = None,
                 max_num_seqs: int = _D["max_num_seqs"], max_num_batched_tokens: int = _D["max_num_batched_tokens"],
                 kv_cache_memory: int | None = None, num_blocks: int | None = None,
                 watermark: float = _D["watermark"], attention_backend: str | None = None, seed: int = _D["seed"],
                 warmup: bool = _D["warmup"], return_logits: bool = False, load_format: str = _D["load_format"],
                 weights_dir: str | None = None, max_queue_len: int = OFFLINE_MAX_QUEUE_LEN,
                 enable_prefix_caching: bool = _D["enable_prefix_caching"],
                 tensor_parallel_size: int = _D["tensor_parallel_size"],
                 data_parallel_size: int = _D["data_parallel_size"],
                 enable_expert_parallel: bool = _D["enable_expert_parallel"], expert_parallel_size: int | None = None,
                 tokenizer: str | None = None,
                 chat_template: str | None = None, gpu_memory_utilization: float | None = None,
                 block_size: int = _D["block_size"], use_tqdm: bool = True, scheduler: str = _D["scheduler"],
                 scheduling_policy: str = _D["scheduling_policy"], priority_aging_s: float | None = None,
                 quantization: str | None = None, kv_cache_dtype: str = _D["kv_cache_dtype"],
                 speculative_config=None, runner: str = _D["runner"], pooling_type: str = _D["pooling_type"],
                 reasoning_parser: str | None = None,
                 **engine_kwargs):
        from jaxinfer.engine.builder import load_model, load_tokenizer, resolve_dtype
        from jaxinfer.weights.catalog import default_weights_dir

        weights_dir = str(weights_dir or default_weights_dir())
        flags = {k: v for k, v in locals().items() if k in _D}  # the table's keywords, as given
        flags.update(model=str(model))
        parallel = ParallelConfig(tensor_parallel_size=tensor_parallel_size, data_parallel_size=data_parallel_size,
                                  enable_expert_parallel=enable_expert_parallel,
                                  expert_parallel_size=expert_parallel_size)
        # a bad dtype, runner or pooling type is refused before JAX is asked
        EngineConfig(model_path=str(model), dtype=dtype, runner=runner, pooling_type=pooling_type)
        SpeculativeConfig.from_value(speculative_config)  # and a bad speculative config
        if chat_template is not None:
            from jaxinfer.tokenizer.templates import load_chat_template

            load_chat_template(chat_template)  # a bad value is refused before the weights load
        if tokenizer is not None and not isinstance(tokenizer, (str, Path)):  # a Tokenizer object (tests)
            engine_kwargs["tokenizer"], tokenizer = tokenizer, None
        elif tokenizer is not None:
            tokenizer = str(tokenizer)
        flags.update(dtype=resolve_dtype(dtype), tokenizer=tokenizer)
        probe = EngineConfig(model_path=str(model), dtype=flags["dtype"], parallel=parallel, tokenizer=tokenizer)
        if "model_config" not in engine_kwargs:
            mc, params, tok, _ = load_model(probe, load_format, weights_dir)
            engine_kwargs.update(model_config=mc, params=params, tokenizer=tok)
        elif tokenizer is not None:
            engine_kwargs["tokenizer"] = load_tokenizer(tokenizer, weights_dir)
        config = engine_config(llm_namespace(flags), engine_kwargs["model_config"], return_logits=return_logits)
        self.engine = build_engine(config, load_format=load_format, weights_dir=weights_dir, use_tqdm=use_tqdm,
                                   **engine_kwargs)
        self._counter = 0

    def get_tokenizer(self):
        return self.engine.tokenizer

    @property
    def runner(self) -> str:
        """``"generate"`` or ``"pooling"`` (the engine's ``runner``)."""
        return self.engine.config.runner

    def embed(self, prompts: str | Sequence[str] | Sequence[int] | Sequence[Sequence[int]],
              pooling_params: PoolingParams | None = None, use_tqdm: bool = True) -> list[EmbeddingRequestOutput]:
        """Embed a batch of prompts (strings or token-id lists); one output per prompt, in order
        (vLLM's ``LLM.embed``): the pooled final hidden states (``pooling_type``), L2-normalized
        unless ``pooling_params.normalize`` is False, truncated to ``pooling_params.dimensions``.

        Raises:
          ValueError: this LLM was not built with ``runner="pooling"``.
          RequestError: a prompt is invalid (too long, ids outside the vocabulary, ``dimensions``
            over the hidden size); nothing is submitted then.
        """
        return [EmbeddingRequestOutput.from_base(o) for o in self.encode(prompts, pooling_params, use_tqdm)]

    def encode(self, prompts, pooling_params: PoolingParams | None = None,
               use_tqdm: bool = True) -> list[PoolingRequestOutput]:
        """`embed`, returning vLLM's `PoolingRequestOutput` (the vector as a float32 array)."""
        if self.runner != "pooling":
            raise ValueError("LLM.embed/encode need a pooling model: LLM(..., runner=\"pooling\")")
        params = pooling_params if pooling_params is not None else PoolingParams()
        if not isinstance(params, PoolingParams):
            raise TypeError(f"pooling_params must be PoolingParams, got {type(params).__name__}")
        items = [(p if isinstance(p, str) else None, self._encode(p)) for p in self._prompt_list(prompts)]
        outs = self._run(items, SamplingParams(temperature=0.0), use_tqdm, pooling=params)
        return [PoolingRequestOutput.from_output(o) for o in outs]

    def _check_generate(self) -> None:
        if self.runner == "pooling":
            raise ValueError("this LLM serves embeddings (runner=\"pooling\"): use LLM.embed; generate and "
                             "chat need runner=\"generate\"")

    def generate(self, prompts: str | Sequence[str] | Sequence[int] | Sequence[Sequence[int]],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 use_tqdm: bool = True, priority: Sequence[int] | None = None) -> list[RequestOutput]:
        """Generate for a batch of prompts (strings or token-id lists).

        ``priority`` (one integer per prompt, as vLLM's ``generate``) overrides the
        sampling params' ``priority``; only the priority policy uses it.

        Raises:
          RequestError: a prompt is invalid (nothing is submitted then).
          ValueError: this LLM was built with ``runner="pooling"``.
        """
        self._check_generate()
        items = [(p if isinstance(p, str) else None, self._encode(p)) for p in self._prompt_list(prompts)]
        return self._run(items, sampling_params, use_tqdm, priority)

    @staticmethod
    def _prompt_list(prompts) -> list:
        """One prompt (a string or a list of token ids) or a list of those, as a list."""
        if isinstance(prompts, str) or (isinstance(prompts, (list, tuple)) and prompts
                                        and not isinstance(prompts[0], (str, list, tuple))):
            prompts = [prompts]
        if not isinstance(prompts, (list, tuple)):
            raise TypeError("prompts must be a string, a list of token ids, or a list of those; got "
                            f"{type(prompts).__name__}")
        return list(prompts)

    def chat(self, messages, sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
             use_tqdm: bool = True, add_generation_prompt: bool = True,
             continue_final_message: bool = False, chat_template_kwargs: dict | None = None) -> list[RequestOutput]:
        """Apply the model's chat template to one conversation (list of messages) or many.

        A message is ``{"role": "system" | "developer" | "user" | "assistant", "content": str
        or a list of {"type": "text", "text": str} parts}``, as in the HTTP API.
        ``chat_template_kwargs``: more template variables (``{"enable_thinking": False}``).

        Raises:
          RequestError: an empty conversation or a malformed message (param ``messages``).
          ValueError: this LLM was built with ``runner="pooling"``.
        """
        self._check_generate()
        if isinstance(messages, dict):
            raise RequestError("messages must be a list of message dicts (one conversation) or a list of those; "
                               "got one dict: wrap it in a list", param="messages")
        if not isinstance(messages, (list, tuple)):
            raise RequestError(f"messages must be a list of message dicts, got {type(messages).__name__}",
                               param="messages")
        convs = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        if not convs:
            raise RequestError("messages must contain at least one message", param="messages")
        tok = self._tokenizer()
        items = [chat.render_conversation(chat.conversation_from_dicts(conv), tok,
                                          add_generation_prompt=add_generation_prompt,
                                          continue_final_message=continue_final_message,
                                          chat_template_kwargs=chat_template_kwargs) for conv in convs]
        return self._run(items, sampling_params, use_tqdm, template_kwargs=chat_template_kwargs)

    # ----- internals ----------------------------------------------------------------------
    def _tokenizer(self):
        if self.engine.tokenizer is None:
            raise ValueError("this model has no tokenizer: pass token ids")
        return self.engine.tokenizer

    def _encode(self, prompt) -> list[int]:
        if isinstance(prompt, str):
            chat.check_text(prompt, "prompt")
            return self._tokenizer().encode(prompt)
        if isinstance(prompt, (list, tuple)) and all(is_integer(t) for t in prompt):
            return [int(t) for t in prompt]
        raise TypeError(f"a prompt must be a string or a list of int token ids, got {prompt!r:.80}")

    def _after_reasoning(self, item, params: SamplingParams, template_kwargs: dict | None) -> SamplingParams:
        """``params`` with its constraint moved after the reasoning the prompt ``item`` (text,
        ids) leaves the output in (`jaxinfer.reasoning`), when a reasoning parser is set."""
        parser = get_parser(self.engine.config.reasoning_parser)
        if parser is None or params.structured_outputs is None:
            return params
        text = item[0]
        if text is None and self.engine.tokenizer is not None:
            text = self.engine.tokenizer.decode(item[1][-PROMPT_TAIL_TOKENS:], skip_special_tokens=False)
        mode = parser.start_mode(text, template_kwargs)
        return params.replace(structured_outputs=params.structured_outputs.after_reasoning(mode))

    def _run(self, items, sampling_params, use_tqdm: bool, priority=None, template_kwargs=None,
             pooling: PoolingParams | None = None) -> list[RequestOutput]:
        if sampling_params is None:
            sampling_params = SamplingParams()
        if isinstance(sampling_params, SamplingParams):
            sampling_params = [sampling_params] * len(items)
        if not isinstance(sampling_params, (list, tuple)):
            raise TypeError(f"sampling_params must be SamplingParams or a list of them, got "
                            f"{type(sampling_params).__name__}")
        sampling_params = list(sampling_params)
        if len(sampling_params) != len(items):
            raise ValueError(f"{len(sampling_params)} SamplingParams for {len(items)} prompts: give one, or one each")
        if not all(isinstance(sp, SamplingParams) for sp in sampling_params):
            raise TypeError("sampling_params must be SamplingParams objects")
        if priority is not None:
            if not isinstance(priority, (list, tuple)):
                raise TypeError(f"priority must be a list of integers, one per prompt, got {type(priority).__name__}")
            if len(priority) != len(items):
                raise ValueError(f"{len(priority)} priorities for {len(items)} prompts: give one each")
            sampling_params = [dataclasses.replace(sp, priority=p) for sp, p in zip(sampling_params, priority)]
        sampling_params = [self._after_reasoning(item, sp, template_kwargs) for item, sp in zip(items, sampling_params)]
        ids = self._submit(items, sampling_params, pooling)
        mine = {r for rids in ids for r in rids}
        prompt_of = {r: i for i, rids in enumerate(ids) for r in rids}
        left = [len(rids) for rids in ids]  # unfinished sequences per prompt
        finished: dict[str, RequestOutput] = {}
        try:
            desc = "Generating" if pooling is None else "Embedding"
            with tqdm(total=len(ids), desc=desc, unit="prompt", disable=not use_tqdm) as bar:
                while len(finished) < len(mine):
                    for out in self.engine.step():
                        if out.finished and out.request_id in mine and out.request_id not in finished:
                            finished[out.request_id] = out
                            i = prompt_of[out.request_id]
                            left[i] -= 1
                            if not left[i]:  # the bar counts prompts: all n sequences of this one are done
                                bar.update(1)
        except BaseException:  # Ctrl+C in a notebook: abort this call's requests, keep the LLM usable
            for rid in mine - finished.keys():
                self.engine.abort_request(rid)  # blocks freed now; later calls skip their outputs
            raise
        return [self._merge(items[i], [finished[r] for r in rids]) for i, rids in enumerate(ids)]

    def _submit(self, items, params_list, pooling: PoolingParams | None = None) -> list[list[str]]:
        """Add every prompt's ``n`` sequences as one group (all or none); ``pooling``: as
        pooling requests."""
        specs, ids = [], []
        for (text, toks), sp in zip(items, params_list):
            rids = []
            for j in range(sp.n):
                rid = f"offline-{self._counter}"
                self._counter += 1
                child = sp if sp.n == 1 else dataclasses.replace(sp, n=1, seed=choice_seed(sp.seed, j))
                specs.append(RequestSpec(rid, toks, child, prompt=text, pooling=pooling))
                rids.append(rid)
            ids.append(rids)
        self.engine.add_requests(specs)
        return ids

    @staticmethod
    def _merge(item, outs: list[RequestOutput]) -> RequestOutput:
        first = outs[0]
        comps = []
        for j, o in enumerate(outs):
            c = o.outputs[0]
            c.index = j
            comps.append(c)
        return RequestOutput(first.request_id, item[0], first.prompt_token_ids, comps, True, first.metrics,
                             num_cached_tokens=first.num_cached_tokens, prompt_logprobs=first.prompt_logprobs,
                             pooled=first.pooled)

