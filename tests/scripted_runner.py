"""A fake runner that writes a scripted answer, within the structured-output mask.

`ScriptedRunner.script` is ``(prompt_len, token_ids)``: a row whose last token sits at
position ``prompt_len - 1 + k`` emits ``token_ids[k]`` (EOS past the end). When the step's
bitmask forbids that token (a grammar is on), the row emits EOS if allowed, else the
smallest allowed id, as a sampler under the mask would pick something allowed: so a
script that a constraint admits comes back verbatim, and one it refuses does not.
Without a script it is `FakeRunner` (next token = last + 1).
"""
from __future__ import annotations

import numpy as np

from fakes import FakeRunner

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
