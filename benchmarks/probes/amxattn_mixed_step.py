"""What a prompt chunk costs inside a decode step: 31 rows decoding (256-token prompts) plus one new
prompt of P tokens in the same step, against the pure 31-row decode step (timed just before it)
and the P-token prompt prefilled alone. Medians of 6 (5 alone). Usage: mixed_step.py [P ...]."""
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from jaxinfer import LLM, SamplingParams  # noqa: E402

Ps = [int(x) for x in sys.argv[1:]] or [32, 96, 160, 256, 480]
llm = LLM(str(ROOT / "weights/smollm2-135m-instruct"), use_tqdm=False, enable_prefix_caching=False)
e = llm.engine
rs = np.random.RandomState(0)
decoding = SamplingParams(temperature=0.0, max_tokens=2000, ignore_eos=True)
one = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)


def timed_step() -> float:
    t = time.perf_counter()
    e.step()
    return time.perf_counter() - t


def alone(P: int, reps: int = 5) -> float:
    out = []
    for k in range(reps):
        e.add_request(f"alone-{P}-{k}", rs.randint(256, 16000, P).tolist(), one)
        out.append(timed_step())
        while e.requests:
            e.step()
    return statistics.median(out)


res = {P: {"alone": alone(P), "pure": [], "mixed": []} for P in Ps}
for i in range(31):
    e.add_request(f"decode-{i}", rs.randint(256, 16000, 256).tolist(), decoding)
while any(r.num_output_tokens == 0 for r in e.requests.values()):
    e.step()
for rep in range(6):
    for P in Ps:
        res[P]["pure"].append(timed_step())
        e.add_request(f"mixed-{P}-{rep}", rs.randint(256, 16000, P).tolist(), one)
        res[P]["mixed"].append(timed_step())
        while len(e.requests) > 31:
            e.step()
for P in Ps:
    r = res[P]
    pure, mixed = statistics.median(r["pure"]), statistics.median(r["mixed"])
    print(f"P={P:4d}: alone {1e3 * r['alone']:6.1f} ms | pure decode (31 rows) {1e3 * pure:6.1f} | "
          f"mixed {1e3 * mixed:6.1f} | mixed - pure {1e3 * (mixed - pure):6.1f} ms = {(mixed - pure) / r['alone']:.2f}x alone")
