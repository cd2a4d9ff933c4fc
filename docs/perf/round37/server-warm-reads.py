# Server-warm, mount-cold random 128 KiB reads of the bench dataset on a Penstock mount (round 37):
# each sample drops its own range from the mount's page cache first, so the read reaches penstock-mount
# while the data servers still hold the chunk in their page cache. usage: python3 server-warm-reads.py SECONDS
import os,glob,time,random,sys
files=sorted(glob.glob('/var/tmp/m1/bench-train-*/*'))
fds=[os.open(f,os.O_RDONLY) for f in files]
for fd in fds: os.posix_fadvise(fd,0,0,os.POSIX_FADV_RANDOM)
rnd=random.Random(3); n=0; t0=time.time(); secs=float(sys.argv[1])
while time.time()-t0<secs:
    fd=rnd.choice(fds); off=rnd.randrange(0,(128<<20)-131072)//4096*4096
    os.posix_fadvise(fd,off,131072,os.POSIX_FADV_DONTNEED)
    os.pread(fd,131072,off); n+=1
print('reads',n,'per s',n/secs)
