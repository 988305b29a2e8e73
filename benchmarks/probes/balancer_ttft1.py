import httpx, time, json, sys
url = sys.argv[1]
hist = [{"role": "system", "content": "You are a concise assistant for a travel agency. " * 3}]
def turn(msgs):
    body = {"model": "smollm2-135m-instruct", "messages": msgs, "max_tokens": 64, "temperature": 0, "stream": True}
    t0 = time.perf_counter(); first = None; firstev = None; text = ""
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=60) as r:
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]": continue
            ev = json.loads(line[6:])
            if firstev is None: firstev = time.perf_counter() - t0
            for c in ev.get("choices", []):
                p = c.get("delta", {}).get("content")
                if p:
                    if first is None: first = time.perf_counter() - t0
                    text += p
    return first, firstev, time.perf_counter() - t0, text
for i in range(6):
    hist.append({"role": "user", "content": f"Question {i}: what should I see in Lisbon in three days, and where should we eat?"})
    f, fe, e, text = turn(hist)
    print(f"turn {i}: first content {f*1000:.0f} ms, first event {fe*1000:.0f} ms, e2e {e*1000:.0f} ms")
    hist.append({"role": "assistant", "content": text})
