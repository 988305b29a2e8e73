"""How far the continuous/static throughput ratio on a run can move with the decode step's
per-row cost, on this CPU. Steps are rebuilt from the per-token arrival times of a compare run
(tokens less than 20 ms apart are one step, as in steps_from_runs.py); the time between steps
is fitted as a + b * rows + c * (context tokens / 1,000) over the steps under 2x the median
(the longer ones carry a prompt chunk). The ratio is then recomputed from the same steps with b
and c scaled (the context term is the attention kernel reading K/V), each mode keeping its own
a and each step its own residual (long steps included).

Usage: per_row_ceiling.py CONTINUOUS.json STATIC.json [PER_ROW_MS,CONTEXT_SCALE ...]
"""
import sys
from pathlib import Path

import numpy as np

# The step reconstruction of steps_from_runs.py (tokens less than 20 ms apart are one step).
sys.path.insert(0, str(Path(__file__).resolve().parent))
from amxattn_steps_from_runs import steps as arrival_steps  # noqa: E402


def steps(path):
    T, R, C = arrival_steps(path)
    R, C = R.astype(float), C.astype(float) / 1000
    dt, R, C = np.diff(T), R[1:], C[1:]
    short = dt < 2 * np.median(dt)
    A = np.stack([np.ones(short.sum()), R[short], C[short]], 1)
    (a, b, c), *_ = np.linalg.lstsq(A, 1000 * dt[short], rcond=None)
    return dict(R=R, C=C, dt=1000 * dt, short=short, a=a, b=b, c=c)


def throughput(s, b, c_scale=1.0):
    """Tokens per second with per-row cost b (ms) and the context cost scaled by c_scale: each
    step's time changes by the modelled difference (its own residual kept)."""
    change = (b - s["b"]) * s["R"] + (c_scale - 1) * s["c"] * s["C"]
    t = s["dt"] + change
    return s["R"].sum() / t.sum() * 1000


cont, stat = steps(sys.argv[1]), steps(sys.argv[2])
# One fit over both runs' short steps (the same step function; the continuous run alone has
# nearly 32 rows in every step, so its own intercept and per-row slope are not separable).
both = [np.concatenate([cont[k][cont["short"]], stat[k][stat["short"]]]) for k in ("R", "C", "dt")]
n_cont = int(cont["short"].sum())
A = np.stack([np.ones(len(both[0])), (np.arange(len(both[0])) >= n_cont).astype(float), both[0], both[1]], 1)
(a, d, b, c), *_ = np.linalg.lstsq(A, both[2], rcond=None)
print(f"joint fit: {a:.1f} ms (static {d:+.1f} ms) + {b:.2f} ms/row + {c:.2f} ms per 1,000 context tokens")
for s_, a_ in ((cont, a), (stat, a + d)):
    s_.update(a=a_, b=b, c=c)
for name, s in (("continuous", cont), ("static", stat)):
    print(f"{name}: {len(s['R'])} steps, mean rows {s['R'].mean():.1f}, fit {s['a']:.1f} ms + {s['b']:.2f} ms/row "
          f"+ {s['c']:.2f} ms per 1,000 context tokens; long steps {s['dt'][~s['short']].sum() / 1000:.1f} s "
          f"of {s['dt'].sum() / 1000:.1f} s")
print(f"measured ratio (these steps) {throughput(cont, cont['b']) / throughput(stat, stat['b']):.2f}x")
cases = [tuple(map(float, x.split(","))) for x in sys.argv[3:]] or [
    (b, k) for k in (1.0, 0.75, 0.5, 0.0) for b in (cont["b"], 0.5, 0.0)]
for b, k in cases:
    print(f"per-row {b:.2f} ms, context term x{k:.2f} (both modes): ratio "
          f"{throughput(cont, b, k) / throughput(stat, b, k):.2f}x")
