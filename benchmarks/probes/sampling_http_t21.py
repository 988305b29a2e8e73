exec(open("t20.py").read().split("bad=0")[0])
for params in [{"temperature":0},{"temperature":2,"top_k":1}]:
    with ThreadPoolExecutor(8) as ex: res=list(ex.map(one,[(p,params) for p in prompts]*3))
    mism=[p for p,_,ch in res if ch["text"]!=greedy[p]]
    print("concurrent",json.dumps(params),"mismatch vs alone-greedy:",len(mism),sorted(set(mism)))
    seq=[one((p,params)) for p in prompts]
    print("sequential",json.dumps(params),"mismatch:",[p for p,_,ch in seq if ch["text"]!=greedy[p]])
