# Random 128 KiB reads of the bench dataset under DIR, one thread (round 37). usage: python3 lat.py DIR N warm
# 'warm' reads every file whole first, then drops the files' pages with POSIX_FADV_DONTNEED: on a
# local directory that leaves them cold; on a Penstock mount it drops only the mount's page cache,
# the data servers keep theirs. Prints p50/p90/p99 of N samples.
import os, sys, time, random, glob
d=sys.argv[1]; n=int(sys.argv[2]); mode=sys.argv[3]
files=sorted(glob.glob(d+'/bench-train-*/*'))
fds=[os.open(f,os.O_RDONLY) for f in files]
size=os.fstat(fds[0]).st_size
if mode=='warm':
    for fd in fds:
        while os.read(fd, 1<<20): pass
for fd in fds:
    os.posix_fadvise(fd,0,0,os.POSIX_FADV_DONTNEED)
    os.posix_fadvise(fd,0,0,os.POSIX_FADV_RANDOM)
rnd=random.Random(7); lat=[]
for i in range(n):
    fd=rnd.choice(fds); off=rnd.randrange(0,size-131072)//4096*4096
    t=time.perf_counter(); b=os.pread(fd,131072,off); lat.append(time.perf_counter()-t)
lat.sort(); print(mode, 'p50 %.3f ms p90 %.3f p99 %.3f'%(lat[n//2]*1e3,lat[n*9//10]*1e3,lat[n*99//100]*1e3))
