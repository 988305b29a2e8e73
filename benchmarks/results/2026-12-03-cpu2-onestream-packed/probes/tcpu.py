"""CPU seconds per thread of a running server (argv[1]: its pid) over argv[2] streamed requests of stream.py (/proc/<pid>/task/*/stat)."""
import os, sys, time, subprocess
pid = sys.argv[1]
def snap():
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            name = open(f"/proc/{pid}/task/{tid}/comm").read().strip()
            f = open(f"/proc/{pid}/task/{tid}/stat").read().rsplit(")", 1)[1].split()
            out[(tid, name)] = (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
        except FileNotFoundError:
            pass
    return out
a = snap(); t = time.time()
subprocess.run([sys.executable, __file__.rsplit("/", 1)[0] + "/stream.py", sys.argv[2]])
b = snap(); wall = time.time() - t
tot = 0
for k in sorted(b, key=lambda k: -(b[k] - a.get(k, 0))):
    d = b[k] - a.get(k, 0); tot += d
    if d > 0.05: print(k, round(d, 2), "s cpu")
print("wall", round(wall, 1), "total cpu", round(tot, 1))
