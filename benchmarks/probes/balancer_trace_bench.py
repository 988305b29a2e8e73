import sys, time, json
ROOT = str(__import__("pathlib").Path(__file__).resolve().parents[2]); sys.path.insert(0, ROOT + "/benchmarks"); sys.path.insert(0, ROOT)
import cluster_bench as cb
async def chat_turn(http, session, messages, a):
    body = {"model": a.model, "messages": messages, "max_tokens": a.shape.answer_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter(); m0 = time.monotonic()
    ttft, text, usage, rid, m1 = None, "", None, None, None
    async with http.stream("POST", "/v1/chat/completions", json=body, headers={"X-Session-Id": session}) as r:
        instance = r.headers.get("x-jaxinfer-instance")
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            rid = rid or event.get("id")
            usage = event.get("usage") or usage
            for choice in event.get("choices", []):
                piece = choice.get("delta", {}).get("content")
                if piece:
                    if ttft is None:
                        ttft = time.perf_counter() - t0; m1 = time.monotonic()
                    text += piece
    print("CLIENT", rid, m0, m1, file=sys.stderr, flush=True)
    return {"ttft_s": ttft, "text": text, "usage": usage, "instance": instance}
cb.chat_turn = chat_turn
cb.main()
