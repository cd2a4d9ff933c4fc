#define _GNU_SOURCE
#include <stdio.h>
#include <unistd.h>
#include <sched.h>
#include <time.h>
#include <stdlib.h>
int main(int argc,char**argv){int a[2],b[2];pipe(a);pipe(b);int same=atoi(argv[1]);
if(fork()==0){cpu_set_t s;CPU_ZERO(&s);CPU_SET(same?0:1,&s);sched_setaffinity(0,sizeof s,&s);char c;for(;;){if(read(a[0],&c,1)!=1)exit(0);write(b[1],&c,1);}}
cpu_set_t s;CPU_ZERO(&s);CPU_SET(0,&s);sched_setaffinity(0,sizeof s,&s);
struct timespec t0,t1;char c='x';int n=20000;clock_gettime(CLOCK_MONOTONIC,&t0);
for(int i=0;i<n;i++){write(a[1],&c,1);read(b[0],&c,1);}clock_gettime(CLOCK_MONOTONIC,&t1);
printf("%s: %.1f us per round trip\n",same?"same cpu":"cross cpu",((t1.tv_sec-t0.tv_sec)*1e9+(t1.tv_nsec-t0.tv_nsec))/n/1000.0);close(a[1]);return 0;}
