"""`build(padded)`: an engine whose packed products multiply every padding row as before the
`rows` operand (``padded=True``: the products' `rows` forced to the bucket's T, the LM head's
to R), or only the real rows. Shared by padding_rows_ab.py and padding_rows_decode.py (benchmarks/probes)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import jax.numpy as jnp  # noqa: E402
from jaxinfer import LLM  # noqa: E402
from jaxinfer.models import llama  # noqa: E402


def build(padded: bool):
    real, head = llama.real_tokens, llama.lm_head_logits
    if padded:
        llama.real_tokens = lambda meta: jnp.int32(meta.positions.shape[0])
        llama.lm_head_logits = lambda *a, rows=None, **k: head(*a, **k)
    try:
        return LLM(max_num_seqs=64, max_num_batched_tokens=512, use_tqdm=False).engine
    finally:
        llama.real_tokens, llama.lm_head_logits = real, head
