# Per-file latency of create + write (8 KiB) + close, one thread, N files in a new directory per
# mount and round; mounts alternate (A B A B ...). usage: small-lat.py N ROUNDS MOUNT...
import os, sys, time, statistics
n=int(sys.argv[1]); rounds=int(sys.argv[2]); mounts=sys.argv[3:]
buf=b'x'*8192; res={m:[] for m in mounts}
for r in range(rounds):
    for m in mounts:
        d='%s/lat-%d-%d'%(m,os.getpid(),r); os.mkdir(d); lat=[]
        for i in range(n):
            t=time.perf_counter(); fd=os.open('%s/f%d'%(d,i),os.O_CREAT|os.O_WRONLY|os.O_EXCL,0o644); os.write(fd,buf); os.close(fd); lat.append(time.perf_counter()-t)
        lat.sort(); res[m].append((statistics.median(lat)*1e6, lat[int(len(lat)*0.99)]*1e6, n/sum(lat)))
for m in mounts:
    print('%-14s p50 us %s  p99 us %s  files/s %s'%(m, ' '.join('%.0f'%x[0] for x in res[m]), ' '.join('%.0f'%x[1] for x in res[m]), ' '.join('%.0f'%x[2] for x in res[m])))
