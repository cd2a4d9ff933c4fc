# Meta requests and time per rename and per rmdir (round 39): in a new directory of a Penstock mount,
# writes N small files under temporary names and makes N subdirectories, then renames each file into
# place (a checkpoint's write-then-rename), removes each subdirectory, and moves N directories to a
# second directory; `penstock stats --json --methods` around each phase.
# usage (root): python3 rename-rmdir-calls.py META_HOST:PORT MOUNT N [PENSTOCK_BINARY]
import os, sys, json, subprocess, time
meta, mount, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
P = sys.argv[4] if len(sys.argv) > 4 else '/work/main/build-perf/tools/penstock'
def snap():
    out = subprocess.run([P, 'stats', '--meta', meta, '--json', '--methods'], capture_output=True, text=True).stdout
    d = {}
    for l in out.splitlines():
        o = json.loads(l)
        if 'method' in o and o['server'] == 'meta':
            d[o['method']] = d.get(o['method'], 0) + o['calls']
    return d
# Not round trips of these operations; a change sent inside a Replay envelope counts under its own
# name as well, so the envelopes are left out too.
SKIP = ('GetClusterMap', 'Heartbeat', 'NodeHeartbeat', 'Stats', 'ServerStats', 'Replay', 'ReplayWaiting', 'ReplayInline')
def phase(label, fn):
    a = snap(); t0 = time.perf_counter()
    for i in range(n): fn(i)
    us = (time.perf_counter() - t0) / n * 1e6
    b = snap()
    calls = {k: b[k] - a.get(k, 0) for k in b if b[k] - a.get(k, 0) and k not in SKIP}
    total = sum(calls.values())
    print('%-34s %6.0f us each, %.2f meta round trips each: %s' % (label, us, total / n,
          ', '.join('%s %.2f' % (k, v / n) for k, v in sorted(calls.items()))))
d = '%s/rr%d' % (mount, os.getpid()); d2 = d + '-into'
os.mkdir(d); os.mkdir(d2)
for i in range(n):
    with open('%s/t%d.tmp' % (d, i), 'wb') as f: f.write(b'x' * 4096)
    os.mkdir('%s/d%d' % (d, i)); os.mkdir('%s/m%d' % (d, i))
phase('rename file into place', lambda i: os.rename('%s/t%d.tmp' % (d, i), '%s/t%d' % (d, i)))
phase('rmdir', lambda i: os.rmdir('%s/d%d' % (d, i)))
phase('rename directory to another one', lambda i: os.rename('%s/m%d' % (d, i), '%s/m%d' % (d2, i)))
for i in range(n): os.unlink('%s/t%d' % (d, i)); os.rmdir('%s/m%d' % (d2, i))
os.rmdir(d); os.rmdir(d2)
