import httpx, json, time
from concurrent.futures import ThreadPoolExecutor
c = httpx.Client(base_url="http://localhost:8123", timeout=300, limits=httpx.Limits(max_connections=32))
M="smollm2-135m-instruct"
def comp(b):
    r=c.post("/v1/completions",json={"model":M,**b}); j=r.json()
    return j["choices"][0]["text"] if r.status_code==200 else ("ERR",r.status_code,j)
def conc(target, others):
    with ThreadPoolExecutor(9) as ex:
        fs=[ex.submit(comp,o) for o in others]
        f=ex.submit(comp,target)
        [x.result() for x in fs]; return f.result()
def firstdiff(a,b):
    for i,(x,y) in enumerate(zip(a,b)):
        if x!=y: return i
    return None if len(a)==len(b) else min(len(a),len(b))
T={"prompt":"Once upon a time","max_tokens":64,"temperature":1,"seed":1234}
G={"prompt":"Once upon a time","max_tokens":64,"temperature":0}
prompts=[f"Tell me about topic {i}. "*(i+1) for i in range(8)]
variants={
 "8 greedy others": [{"prompt":p,"max_tokens":80,"temperature":0} for p in prompts],
 "8 T=1 plain others, seeded": [{"prompt":p,"max_tokens":80,"temperature":1,"seed":i} for i,p in enumerate(prompts)],
 "8 T=1 plain others, unseeded": [{"prompt":p,"max_tokens":80,"temperature":1} for i,p in enumerate(prompts)],
 "8 others top_p 0.9": [{"prompt":p,"max_tokens":80,"temperature":1,"top_p":0.9,"seed":i} for i,p in enumerate(prompts)],
 "8 others top_k 5": [{"prompt":p,"max_tokens":80,"temperature":1,"top_k":5,"seed":i} for i,p in enumerate(prompts)],
 "8 others min_p 0.1": [{"prompt":p,"max_tokens":80,"temperature":1,"min_p":0.1,"seed":i} for i,p in enumerate(prompts)],
 "8 copies of same prompt greedy": [{"prompt":"Once upon a time","max_tokens":64,"temperature":0}]*8,
 "1 greedy other": [{"prompt":prompts[0],"max_tokens":80,"temperature":0}],
}
for tname,tgt in [("sampled seed 1234",T),("greedy",G)]:
    a=comp(tgt); a2=comp(tgt)
    print(tname, "alone twice equal:", a==a2)
    for vn,oth in variants.items():
        cc=conc(tgt,oth)
        print(f"  {vn:35s} equal={a==cc} firstdiff_char={firstdiff(a,cc)}", flush=True)
