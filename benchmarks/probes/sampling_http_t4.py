import httpx, json, threading, time
from concurrent.futures import ThreadPoolExecutor
c = httpx.Client(base_url="http://localhost:8123", timeout=300, limits=httpx.Limits(max_connections=32))
M="smollm2-135m-instruct"
def comp(b): 
    r=c.post("/v1/completions",json={"model":M,**b}); return r.status_code, r.json()
def chat(b):
    r=c.post("/v1/chat/completions",json={"model":M,**b}); return r.status_code, r.json()
base=[
 ("comp",{"prompt":"Once upon a time","max_tokens":64,"temperature":1,"seed":1234}),
 ("comp",{"prompt":"Once upon a time","max_tokens":64,"temperature":1.3,"top_p":0.9,"top_k":100,"min_p":0.02,"seed":42}),
 ("chat",{"messages":[{"role":"user","content":"Write a short poem about the sea."}],"max_tokens":64,"temperature":1,"top_p":0.95,"seed":7}),
 ("comp",{"prompt":"Once upon a time","max_tokens":64,"temperature":2,"seed":99}),
]
def go(kind,b):
    s,j=(comp if kind=="comp" else chat)(b)
    if s!=200: return ("ERR",s,j)
    return [ch["text"] if kind=="comp" else ch["message"]["content"] for ch in j["choices"]]
others=[{"prompt":f"Tell me about topic {i}. "*(i+1),"max_tokens":80+i*5,"temperature":0.3+0.2*i,"top_p":[1,0.9,0.5,0.99][i%4],"top_k":[-1,5,50,1000][i%4],"min_p":[0,0.05,0,0.1][i%4],"seed":1000+i, "n":1+(i%3)} for i in range(8)]
for kind,b in base:
    a=go(kind,b); a2=go(kind,b)
    # concurrent: start 8 others, then ours slightly after, then also before
    for delay in [0.0,0.3]:
        with ThreadPoolExecutor(9) as ex:
            fs=[ex.submit(comp,o) for o in others]
            time.sleep(delay)
            f=ex.submit(go,kind,b)
            oth=[x.result() for x in fs]
            cc=f.result()
        print(kind, json.dumps(b)[:120])
        print("  alone==alone2:", a==a2, " alone==concurrent(delay %s):"%delay, a==cc, " others status:",[o[0] for o in oth])
        if a!=cc or a!=a2:
            print("  alone :",repr(a)); print("  alone2:",repr(a2)); print("  conc  :",repr(cc))
