"""Streams argv[1] completions of 128 tokens (greedy, ignore_eos) from a server on port 18123 with httpx; prints each ITL p50."""
import httpx, time, json, sys
prompt = "The history of the printing press " * 20
with httpx.Client(timeout=120) as c:
    for r in range(int(sys.argv[1])):
        t0 = time.perf_counter(); times = []
        with c.stream("POST", "http://localhost:18123/v1/completions", json={"model": "smollm2-135m-instruct", "prompt": prompt, "max_tokens": 128, "stream": True, "ignore_eos": True, "temperature": 0}) as resp:
            for line in resp.iter_lines():
                if line.startswith("data:") and "[DONE]" not in line: times.append(time.perf_counter())
        itl = sorted(b - a for a, b in zip(times, times[1:]))
        print(len(times), "ITL p50 ms", round(itl[len(itl)//2]*1e3, 2))
