// Kernel trace by CUPTI injection: every kernel any CUDA program launches, with its device start
// and end, without changing the program (the device machine has no nsys).
//
//   gcc -O2 -shared -fPIC -I$CUDA/include -I$CUDA/extras/CUPTI/include \
//       -DKREC=CUpti_ActivityKernelN benches/peers/kernel_trace.c \
//       -L$CUDA/extras/CUPTI/lib64 -lcupti -o libktrace.so
//   CUDA_INJECTION64_PATH=$PWD/libktrace.so KTRACE_OUT=trace.tsv <any CUDA program>
//   python3 benches/peers/kernel_trace.py trace.tsv
//
// KREC is the newest kernel record the CUPTI headers define (benches/peers/kernel_trace.sh
// finds it). Each kernel is one line of KTRACE_OUT: name, start ns, end ns, stream, grid x,
// block x, dynamic shared memory. Concurrent-kernel records do not serialise the program's
// kernels, so the gaps between them are the program's own.
#include <cupti.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#ifndef KREC
#error "define KREC as the CUPTI kernel record type (kernel_trace.sh finds it)"
#endif

static FILE* out;

static void CUPTIAPI requested(uint8_t** buf, size_t* size, size_t* max_records) {
    *size = 8u << 20;
    *buf = (uint8_t*)aligned_alloc(8, *size);
    *max_records = 0;
}

static void CUPTIAPI completed(CUcontext ctx, uint32_t stream, uint8_t* buf, size_t size, size_t valid) {
    (void)ctx;
    (void)stream;
    (void)size;
    CUpti_Activity* rec = NULL;
    while (buf && cuptiActivityGetNextRecord(buf, valid, &rec) == CUPTI_SUCCESS) {
        if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && rec->kind != CUPTI_ACTIVITY_KIND_KERNEL) continue;
        const KREC* k = (const KREC*)rec;
        if (out)
            fprintf(out, "%s\t%llu\t%llu\t%u\t%d\t%d\t%d\n", k->name, (unsigned long long)k->start,
                    (unsigned long long)k->end, k->streamId, k->gridX, k->blockX, k->dynamicSharedMemory);
    }
    size_t dropped = 0;
    if (cuptiActivityGetNumDroppedRecords(ctx, stream, &dropped) == CUPTI_SUCCESS && dropped)
        fprintf(stderr, "kernel_trace: %zu records dropped\n", dropped);
    free(buf);
}

static void finish(void) {
    cuptiActivityFlushAll(1);
    if (out) fclose(out);
    out = NULL;
}

// Called by the CUDA driver when CUDA_INJECTION64_PATH names this library.
int InitializeInjection(void) {
    const char* path = getenv("KTRACE_OUT");
    out = fopen(path ? path : "ktrace.tsv", "w");
    if (!out) {
        fprintf(stderr, "kernel_trace: cannot open %s\n", path ? path : "ktrace.tsv");
        return 0;
    }
    if (cuptiActivityRegisterCallbacks(requested, completed) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
        fprintf(stderr, "kernel_trace: CUPTI refused the activity callbacks\n");
        return 0;
    }
    atexit(finish);
    return 1;
}
