/*
 * common/json_writer.h - building and writing a JSON document, for the
 * chapters' --json results (common/harness.c).
 *
 * Why not cJSON, which the engine uses: chapters 01-07 link only the shared
 * core (common/, reference/, kernels/) and no library of the engine's, so a
 * learner can build chapter 01 with a compiler, the CUDA toolkit and nothing
 * else. Writing JSON is the easy direction (no parsing, no error recovery):
 * a tree of objects, arrays, strings, numbers and booleans, printed with
 * string escaping and numbers that read back exactly. Reading JSON (config
 * files, requests) stays cJSON's job. tests/test_common.c parses this
 * writer's output with cJSON to check it.
 *
 * Programs only: out of memory exits with a message (mv_die_at).
 */
#ifndef MV_JSON_WRITER_H
#define MV_JSON_WRITER_H

#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mv_json mv_json_t;

mv_json_t *mvj_object(void);
mv_json_t *mvj_array(void);
mv_json_t *mvj_string(const char *s);  // a copy of s (NULL: "")
mv_json_t *mvj_number(double x);       // NaN and +-inf are written as null
mv_json_t *mvj_bool(int b);

// Set obj[key] = item, replacing an existing value of that key (keys stay
// unique and in the order they were first set). obj owns item afterwards.
void mvj_set(mv_json_t *obj, const char *key, mv_json_t *item);
void mvj_set_string(mv_json_t *obj, const char *key, const char *s);
void mvj_set_number(mv_json_t *obj, const char *key, double x);
void mvj_set_bool(mv_json_t *obj, const char *key, int b);
// A new empty object / array set as obj[key]; returned to be filled.
mv_json_t *mvj_set_object(mv_json_t *obj, const char *key);
mv_json_t *mvj_set_array(mv_json_t *obj, const char *key);
// Append item to the array arr, which owns it afterwards.
void mvj_push(mv_json_t *arr, mv_json_t *item);

// Write v to f, indented, with a final newline. 0, or -1 when a write
// fails (errno says why).
int mvj_write(const mv_json_t *v, FILE *f);
void mvj_free(mv_json_t *v);

#ifdef __cplusplus
}
#endif
#endif
