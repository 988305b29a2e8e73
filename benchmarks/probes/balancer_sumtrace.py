import collections, glob, sys
from jax.profiler import ProfileData
total, count = collections.Counter(), collections.Counter()
f = glob.glob(f"{sys.argv[1]}/plugins/profile/*/*.xplane.pb")[0]
for plane in ProfileData.from_file(f).planes:
    for line in plane.lines:
        for ev in line.events:
            total[(plane.name[:20], line.name[:25], ev.name[:60])] += ev.duration_ns; count[(plane.name[:20], line.name[:25], ev.name[:60])] += 1
for k, v in total.most_common(40):
    print(f"{v/1e6:8.2f} ms  x{count[k]:4d}  {k}")
