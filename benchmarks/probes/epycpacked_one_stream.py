import json, statistics, sys, time, httpx
port = sys.argv[1]
prompt = list(range(1000, 1128))
def run():
    t_last, gaps, first = None, [], None
    t0 = time.perf_counter()
    with httpx.stream("POST", f"http://127.0.0.1:{port}/v1/completions", json={"model": "smollm2-135m-instruct", "prompt": prompt, "max_tokens": 128, "ignore_eos": True, "stream": True, "temperature": 0, "cache_prompt": False}, timeout=60) as r:
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]": continue
            t = time.perf_counter()
            if t_last is None: first = t - t0
            else: gaps.append(t - t_last)
            t_last = t
    return first, gaps
for i in range(6):
    first, gaps = run()
    print(f"ttft {first*1e3:.1f} ms, ITL median {statistics.median(gaps)*1e3:.2f} ms mean {statistics.mean(gaps)*1e3:.2f} n={len(gaps)}")
