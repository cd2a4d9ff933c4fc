# Meta and data requests per small file (round 37): creates, writes (8 KiB) and closes N files in a new
# directory of a Penstock mount, drops the kernel caches, reads them back, unlinks them; `penstock stats --json
# --methods` around each phase. usage (root; cluster meta at 127.0.0.1:26000, mount /var/tmp/m1): python3 meta-calls-per-file.py N
import os, sys, json, subprocess
P='/work/main/build-perf/tools/penstock'
def snap():
    out=subprocess.run([P,'stats','--meta','127.0.0.1:26000','--json','--methods'],capture_output=True,text=True).stdout
    d={}
    for l in out.splitlines():
        o=json.loads(l)
        if 'method' in o:
            k=(o['server'],o['method']); d[k]=d.get(k,0)+o['calls']
    return d
def diff(a,b,n,label):
    print(label)
    for k in sorted(b):
        v=b[k]-a.get(k,0)
        if k[1] in ('GetClusterMap','Heartbeat','NodeHeartbeat'): continue
        if v: print('  %-5s %-20s %7d  %.2f per file'%(k[0],k[1],v,v/n))
n=int(sys.argv[1]); d='/var/tmp/m1/probe/d%d'%os.getpid(); os.mkdir(d)
s0=snap()
for i in range(n):
    fd=os.open('%s/f%d'%(d,i),os.O_CREAT|os.O_WRONLY,0o644); os.write(fd,b'x'*8192); os.close(fd)
s1=snap(); diff(s0,s1,n,'create+write+close')
open('/proc/sys/vm/drop_caches','w').write('3')
s2=snap()
for i in range(n):
    fd=os.open('%s/f%d'%(d,i),os.O_RDONLY); os.read(fd,1<<20); os.close(fd)
s3=snap(); diff(s2,s3,n,'open+read+close (kernel caches dropped)')
for i in range(n): os.unlink('%s/f%d'%(d,i))
s4=snap(); diff(s3,s4,n,'unlink')
os.rmdir(d)
