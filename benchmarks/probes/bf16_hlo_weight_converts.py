import re, sys, collections
from jaxinfer import LLM, SamplingParams
llm = LLM("smollm2-135m-instruct", dtype="bfloat16", max_model_len=512, max_num_seqs=4, max_num_batched_tokens=64, num_blocks=256, warmup=False)
llm.generate(["Hello there"], SamplingParams(max_tokens=3, temperature=0), use_tqdm=False)
r = llm.engine.runner
for b, ex in r._executables.items():
    txt = ex.as_text()
    open(f"/tmp/bf/hlo_T{b.num_tokens}.txt","w").write(txt)
    c = collections.Counter()
    for l in txt.splitlines():
        l=l.strip()
        m = re.match(r"(ROOT )?%(\S+) = (f32\[[\d,]+\])\S* (\w[\w-]*)\(", l)
        if m:
            dims=[int(x) for x in re.findall(r"\d+", m.group(3)[3:])]
            n=1
            for d in dims: n*=d
            if n>=100_000: c[(m.group(3), m.group(4), m.group(2).split(".")[0])]+=1
    print(b)
    for k,v in c.most_common(30): print("   ",v,k)
