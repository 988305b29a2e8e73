"""Requests through HAProxy separated by idle gaps around uvicorn's keep-alive timeout."""
import sys, time, httpx
url = sys.argv[1]  # the balancer, e.g. http://127.0.0.1:8030
gaps = [4.90 + 0.01 * i for i in range(20)]
fails = 0
with httpx.Client(base_url=url, timeout=30) as c:
    for g in gaps:
        try:
            r = c.post("/v1/completions", json={"model": "smollm2-135m-instruct", "prompt": "Hi", "max_tokens": 1})
            ok = r.status_code
        except httpx.HTTPError as e:
            ok = type(e).__name__; fails += 1
        print(f"gap {g:.2f}: {ok}", flush=True)
        time.sleep(g)
print("failures", fails)
