"""Engine steps reconstructed from a compare run's per-token arrival times (`runs/*.json`):
tokens of all requests less than GAP apart belong to one step (the server streams one step's
tokens together; one step's 32 deliveries can spread over more than 4 ms, steps are 40+ ms
apart). Prints, per 5 s window, steps and mean rows per step, and a least-squares fit of the
time between steps on (1, rows, context tokens) over the steps under 2x the median (the longer
ones carry a prompt chunk). Usage: steps_from_runs.py RUN.json ..."""
import json
import sys

import numpy as np

GAP = 0.02  # s


def steps(path: str):
    reqs = [x for x in json.load(open(path))["requests"] if x["outcome"] == "ok"]
    t0 = min(x["start"] for x in reqs)
    events = []  # (arrival time, the row's context after this token)
    for x in reqs:
        t = x["start"] - t0 + x["ttft"]
        events.append((t, x["prompt_len"] + 1))
        for k, itl in enumerate(x["itl"]):
            t += itl
            events.append((t, x["prompt_len"] + 2 + k))
    events.sort()
    groups = [[events[0]]]
    for ev in events[1:]:
        (groups[-1].append(ev) if ev[0] - groups[-1][-1][0] < GAP else groups.append([ev]))
    return (np.array([g[0][0] for g in groups]), np.array([len(g) for g in groups]),
            np.array([sum(c for _, c in g) for g in groups]))


if __name__ == "__main__":
    for path in sys.argv[1:]:
        T, R, C = steps(path)
        dt, R1, C1 = np.diff(T), R[1:], C[1:]
        ok = dt < 2 * np.median(dt)
        A = np.stack([np.ones(ok.sum()), R1[ok], C1[ok] / 1000], 1)
        coef, *_ = np.linalg.lstsq(A, 1000 * dt[ok], rcond=None)
        print(f"{path}: {len(T)} steps, {R.sum()} tokens; median step {1000 * np.median(dt):.1f} ms; "
              f"fit: {coef[0]:.1f} ms + {coef[1]:.2f} ms per row + {coef[2]:.2f} ms per 1,000 context tokens "
              f"(residual sd {np.std(1000 * dt[ok] - A @ coef):.1f} ms; {int((~ok).sum())} longer steps, {dt[~ok].sum():.1f} s)")
        window = np.digitize(T, np.arange(0, T[-1] + 5, 5))
        print("  per 5 s (steps, mean rows):",
              ", ".join(f"({int((window == w).sum())}, {R[window == w].mean():.1f})" for w in np.unique(window)))
