// How fast this machine streams memory into one or more cores: each thread reads its share
// of 512 MiB of anonymous memory four times with 32-byte AVX2 loads. A reference for decode
// rates, which stream every weight once per token (bench/runs/2026-12-07-epyc-avx2-2core).
//
//   gcc -O2 -mavx2 -pthread bench/read_bandwidth.c -o /tmp/read_bandwidth
//   /tmp/read_bandwidth 1; /tmp/read_bandwidth 2
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SIZE (512UL << 20)
#define PASSES 4
static char *buf;
static int threads;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void *reader(void *arg) {
    size_t share = SIZE / threads;
    const char *p = buf + (long)arg * share;
    __m256i acc = _mm256_setzero_si256();
    for (int pass = 0; pass < PASSES; pass++)
        for (size_t i = 0; i < share; i += 128) {
            acc = _mm256_add_epi8(acc, _mm256_load_si256((const __m256i *)(p + i)));
            acc = _mm256_add_epi8(acc, _mm256_load_si256((const __m256i *)(p + i + 32)));
            acc = _mm256_add_epi8(acc, _mm256_load_si256((const __m256i *)(p + i + 64)));
            acc = _mm256_add_epi8(acc, _mm256_load_si256((const __m256i *)(p + i + 96)));
        }
    static volatile int sink;
    sink = _mm256_extract_epi32(acc, 0);
    return NULL;
}

int main(int argc, char **argv) {
    threads = argc > 1 ? atoi(argv[1]) : 1;
    if (threads < 1 || threads > 64) return fprintf(stderr, "usage: read_bandwidth [THREADS]\n"), 2;
    buf = aligned_alloc(4096, SIZE);
    if (!buf) return perror("aligned_alloc"), 1;
    memset(buf, 1, SIZE);
    pthread_t t[64];
    double start = now();
    for (long i = 0; i < threads; i++) pthread_create(&t[i], NULL, reader, (void *)i);
    for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
    printf("%d thread(s): %.1f GB/s\n", threads, (double)PASSES * SIZE / (now() - start) / 1e9);
    return 0;
}
