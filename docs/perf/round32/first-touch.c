// Round 32: what the first write to fresh memory costs on this VM against a second write to the
// same memory. Maps N MiB of anonymous memory, writes it twice, unmaps it, sleeps S seconds (the
// guest's free page reporting returns freed memory to the host meanwhile), four times.
// build: gcc -O2 -o /tmp/first-touch docs/perf/round32/first-touch.c
// usage: /tmp/first-touch MIB SLEEP_S
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s MIB SLEEP_S\n", argv[0]);
    return 2;
  }
  const size_t n = (size_t)atol(argv[1]) << 20;
  const unsigned pause = (unsigned)atoi(argv[2]);
  for (int round = 0; round < 4; ++round) {
    char* p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      perror("mmap");
      return 1;
    }
    double t = now();
    memset(p, 1, n);
    const double first = now() - t;
    t = now();
    memset(p, 2, n);
    const double second = now() - t;
    printf("round %d: first write %.2f GB/s (%.1f us per 4 KiB page), second write %.2f GB/s\n", round,
           (double)n / first / 1e9, first / ((double)n / 4096) * 1e6, (double)n / second / 1e9);
    munmap(p, n);
    if (pause > 0) sleep(pause);
  }
  return 0;
}
