import httpx, json
from concurrent.futures import ThreadPoolExecutor
c = httpx.Client(base_url="http://localhost:8123", timeout=300, limits=httpx.Limits(max_connections=16))
M="smollm2-135m-instruct"
schema={"type":"object","properties":{"age":{"type":"integer"},"color":{"type":"string","enum":["red","green","blue"]}},"required":["age","color"],"additionalProperties":False}
def valid(s):
    try: o=json.loads(s)
    except Exception as e: return False,"json: "+str(e)
    if not isinstance(o,dict): return False,"not object"
    if set(o)!={"age","color"}: return False,f"keys {list(o)}"
    if type(o["age"]) is not int: return False,"age not int"
    if o["color"] not in ["red","green","blue"]: return False,"bad enum"
    return True,""
def one(i):
    msgs=[{"role":"user","content":"Give me a person's age and favorite color as JSON."}]
    if i%2==0: b={"model":M,"messages":msgs,"temperature":1.5,"top_p":1,"max_tokens":200,"structured_outputs":{"json":schema}}
    else: b={"model":M,"messages":msgs,"temperature":1.5,"top_p":1,"max_tokens":200,"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":schema}}}
    if i>=20: b["seed"]=i  # extra
    r=c.post("/v1/chat/completions",json=b)
    if r.status_code!=200: return i,r.status_code,r.text[:300],None,None
    ch=r.json()["choices"][0]
    return i,200,ch["message"]["content"],ch["finish_reason"],valid(ch["message"]["content"])
with ThreadPoolExecutor(4) as ex: res=list(ex.map(one,range(24)))
bad=0
for i,s,txt,fr,v in res:
    ok = s==200 and v[0]
    bad+= not ok
    print(i,s,fr,v,repr(txt)[:160])
print("invalid:",bad,"/",len(res))
