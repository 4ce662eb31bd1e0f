/*
 * common/versions.h - a kernel's numbered versions as plain data.
 *
 * Every kernel in kernels/ comes in numbered versions (llm.c's dev/cuda/
 * habit): 1 naive and readable, then each faster one. A version table is
 * { number, name } pairs ending with { 0, NULL }. kernels/versions.h holds
 * the tables (the one list of the names); the chapter executables hand them
 * to the harness, which checks --kernel N against them and lists them in
 * --help. Plain C with no CUDA in it, so a CPU-only build has the names too.
 */
#ifndef MV_COMMON_VERSIONS_H
#define MV_COMMON_VERSIONS_H

#include <stddef.h>

typedef struct {
    int number;        // what the launcher's `version` argument and --kernel N take
    const char *name;  // "v1-naive": the name in check lines, timings and --json
} kernel_version_t;

// The name of version `number` in `table`, NULL when it has none.
static inline const char *kernel_version_name(const kernel_version_t *table, int number) {
    for (const kernel_version_t *v = table; v->name; v++)
        if (v->number == number) return v->name;
    return NULL;
}

#endif
