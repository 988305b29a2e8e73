"""Model quality measured through the engine: ``python -m jaxinfer.eval perplexity``.

Perplexity of a fixed text (by default the GNU GPL version 3, present on every Debian
system as ``/usr/share/common-licenses/GPL-3``): the text's first ``max_tokens`` tokens,
cut into consecutive windows of ``window`` tokens, each window sent as one prompt with
``prompt_logprobs`` (`jaxinfer.core.prompt_logprobs`: the same paged, chunked prefill that
serves requests, so quantized weights or KV cache are measured as they serve). Every
prompt position >= 1 of a window is scored given the tokens before it in that window
(windows do not overlap or see each other); a tokenizer that adds a BOS token prefixes
each window with it, so then every text token is scored. Perplexity =
``exp(-(sum of the scored logprobs) / (number scored))``.

`perplexity` is the function (an `LLM`, or a model name and `LLM` keyword arguments);
`windows` gives the exact prompts, for comparing with another implementation.
"""
from __future__ import annotations

import argparse
import inspect
import math
import sys
from pathlib import Path
from typing import Sequence

DEFAULT_TEXT = "/usr/share/common-licenses/GPL-3"
DEFAULT_MAX_TOKENS = 8192
DEFAULT_WINDOW = 1024


def windows(tokenizer, text: str, max_tokens: int = DEFAULT_MAX_TOKENS, window: int = DEFAULT_WINDOW
            ) -> list[list[int]]:
    """The prompts `perplexity` scores: the first ``max_tokens`` tokens of ``text`` (no special
    tokens) in consecutive ``window``-token pieces (the last may be shorter; one of a single
    token is dropped unless there is a BOS prefix), each after the tokenizer's own prefix
    (``encode("")`` with special tokens: BOS or nothing).

    Raises:
      ValueError: ``max_tokens`` or ``window`` < 1, or a text with fewer than 2 tokens.
    """
    if max_tokens < 1 or window < 1:
        raise ValueError("max_tokens and window must be >= 1")
    ids = tokenizer.encode(text, add_special_tokens=False)[:max_tokens]
    prefix = tokenizer.encode("", add_special_tokens=True)
    out = [prefix + ids[i:i + window] for i in range(0, len(ids), window)]
    out = [w for w in out if len(w) >= 2]
    if not out:
        raise ValueError("the text has fewer than 2 tokens: nothing to score")
    return out


def perplexity_of(llm, prompts: Sequence[Sequence[int]]) -> float:
    """Perplexity of ``llm`` over token-id ``prompts``, each scored at positions >= 1."""
    from jaxinfer.sampling_params import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0)
    outs = llm.generate([list(p) for p in prompts], params, use_tqdm=False)
    total, count = 0.0, 0
    for prompt, out in zip(prompts, outs):
        for tok, entry in zip(prompt[1:], out.prompt_logprobs[1:]):
            total += entry[tok].logprob
            count += 1
    return math.exp(-total / count)


def perplexity(llm="smollm2-135m-instruct", *, text: str | None = None, path: str = DEFAULT_TEXT,
               max_tokens: int = DEFAULT_MAX_TOKENS, window: int = DEFAULT_WINDOW, **llm_kwargs) -> float:
    """Perplexity of a model on the first ``max_tokens`` tokens of a text, in ``window``-token
    windows (see the module docstring), computed from the engine's prompt logprobs.

    Args:
      llm: an `LLM`, or a model name / path to build one with ``llm_kwargs`` (``dtype``,
        and the engine's quantization options where it has them: ``quantization``,
        ``kv_cache_dtype``); ``max_model_len`` defaults to what one window needs.
      text: the text itself; else the file at ``path`` (UTF-8).
    Returns:
      exp(mean negative log-likelihood) over the scored tokens (natural log).
    Raises:
      ValueError: bad sizes, too short a text, or a window longer than the LLM's context.
      OSError: ``path`` cannot be read.
    """
    if text is None:
        text = Path(path).read_text(encoding="utf-8")
    if isinstance(llm, (str, Path)):
        from jaxinfer.entrypoints.llm import LLM

        llm_kwargs.setdefault("max_model_len", window + 2)  # a window, a BOS, the one generated token
        llm = LLM(str(llm), **llm_kwargs)
    prompts = windows(llm.get_tokenizer(), text, max_tokens, window)
    limit = llm.engine.config.scheduler.max_model_len
    if max(map(len, prompts)) >= limit:
        raise ValueError(f"a window of {max(map(len, prompts))} tokens does not fit max_model_len {limit}")
    return perplexity_of(llm, prompts)


def _llm_options(args: argparse.Namespace) -> dict:
    """`LLM` keyword arguments from the flags; the quantization flags only when given, and
    only if this build's `LLM` takes them. No warm-up: the windows use a few bucket shapes,
    compiled on first use, instead of every shape a server needs."""
    from jaxinfer.entrypoints.llm import LLM

    opts = {"dtype": args.dtype, "use_tqdm": False, "warmup": False}
    accepted = inspect.signature(LLM.__init__).parameters
    for name in ("quantization", "kv_cache_dtype"):
        value = getattr(args, name)
        if value is not None:
            if name not in accepted:
                raise SystemExit(f"--{name.replace('_', '-')} is not supported by this version of jaxinfer")
            opts[name] = value
    return opts


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m jaxinfer.eval", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    ppl = sub.add_parser("perplexity", help="perplexity of a model on a fixed text, through the engine")
    ppl.add_argument("--model", default="smollm2-135m-instruct", help="as the server's --model")
    ppl.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16"))
    ppl.add_argument("--quantization", default=None, help="weight quantization (as the server's flag)")
    ppl.add_argument("--kv-cache-dtype", default=None, help="KV cache storage dtype (as the server's flag)")
    ppl.add_argument("--text", default=DEFAULT_TEXT, help="UTF-8 text file (default: %(default)s)")
    ppl.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS,
                     help="tokens of the text to score (default: %(default)s)")
    ppl.add_argument("--window", type=int, default=DEFAULT_WINDOW,
                     help="tokens per window, one prompt each (default: %(default)s)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        value = perplexity(args.model, path=args.text, max_tokens=args.max_tokens, window=args.window,
                           **_llm_options(args))
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"perplexity: {value:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
