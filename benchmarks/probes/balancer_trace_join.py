import re, glob, sys, statistics as st
srv = {}
for f in glob.glob(f"/tmp/cl/{sys.argv[1]}-logs/{sys.argv[2]}/inst*.log"):
    for line in open(f):
        if line.startswith("TRACE"):
            p = line.split(); srv[p[1]] = list(map(float, p[2:]))
cli = {}
for line in open(f"/tmp/cl/{sys.argv[1]}.err"):
    if line.startswith("CLIENT"):
        p = line.split(); cli[p[1]] = (float(p[2]), float(p[3]))
names = ["send->handler", "handler->prepared", "prepared->added", "arrival(engine) - added", "arrival->first_token",
         "first_token->first_out(loop)", "first_out->sse", "sse->client"]
rows = []
for rid, (c0, c1) in cli.items():
    if rid not in srv: continue
    t0, tp, ta, arr, ftt, tf, tsse = srv[rid]
    rows.append([t0 - c0, tp - t0, ta - tp, arr - ta, ftt - arr, tf - ftt, tsse - tf, c1 - tsse, c1 - c0])
for i, n in enumerate(names + ["TOTAL"]):
    v = [r[i] * 1000 for r in rows]
    print(f"{n:32s} mean {st.fmean(v):7.1f}  p50 {st.median(v):7.1f}  p90 {sorted(v)[int(.9*len(v))]:7.1f} ms")
