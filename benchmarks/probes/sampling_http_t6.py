import httpx, json, math
from concurrent.futures import ThreadPoolExecutor
c = httpx.Client(base_url="http://localhost:8123", timeout=300, limits=httpx.Limits(max_connections=32))
M="smollm2-135m-instruct"
def comp(b):
    r=c.post("/v1/completions",json={"model":M,**b}); return r.json()["choices"][0]
T={"prompt":"Once upon a time","max_tokens":64,"temperature":1,"seed":1234,"logprobs":5}
prompts=[f"Tell me about topic {i}. "*(i+1) for i in range(8)]
def conc(others):
    with ThreadPoolExecutor(9) as ex:
        fs=[ex.submit(comp,o) for o in others]; f=ex.submit(comp,T); [x.result() for x in fs]; return f.result()
a=comp(T)
for name,oth in [("1 other",[{"prompt":prompts[0],"max_tokens":80,"temperature":0}]),("8 others",[{"prompt":p,"max_tokens":80,"temperature":0} for p in prompts])]:
    b=conc(oth)
    ta,tb=a["logprobs"]["tokens"],b["logprobs"]["tokens"]
    la,lb=a["logprobs"]["token_logprobs"],b["logprobs"]["token_logprobs"]
    i=next((k for k in range(min(len(ta),len(tb))) if ta[k]!=tb[k]),None)
    print(name,"first token diff index",i)
    maxd=max(abs(x-y) for x,y in zip(la[:i],lb[:i])) if i else 0
    print("  max |logprob diff| before divergence:",maxd)
    if i is not None:
        print("  alone   tok",repr(ta[i]),la[i],"top:",a["logprobs"]["top_logprobs"][i])
        print("  concurr tok",repr(tb[i]),lb[i],"top:",b["logprobs"]["top_logprobs"][i])
        for k in range(max(0,i-3),i+1): print("   ",k,repr(ta[k]),la[k],repr(tb[k]),lb[k])
