/*
 * tests/test_tp_mpi.c - tensor parallelism on the CPU backend, over MPI:
 * `mpirun -np N build/minivllm generate -tp N` against tp = 1 and Hugging
 * Face's greedy goldens (tests/data/tiny-qwen3-NAME/golden.json, made by
 * tests/data/make_tiny_qwen3.py).
 *
 * What is checked:
 *   - tp 2 and tp 4 give exactly tp 1's greedy ids, and the goldens', on
 *     the tiny trained checkpoints: tied (4 heads, 2 KV heads: split at tp 2,
 *     each copied on 2 ranks at tp 4), untied (1 KV head, copied on every
 *     rank; an untied LM head), mha (2 heads, tp 2);
 *   - with --random-weights (every rank draws the whole model from the seed
 *     and keeps its shard: what the GPU checks of Qwen3's shapes rely on),
 *     tp 2's first-step logits are tp 1's up to fp32 summation order;
 *   - a size tp does not divide is refused before loading, naming it;
 *   - a rank that cannot load (its own --model without weights, given by
 *     mpirun's "A : B" form) ends every rank non-zero with a message naming
 *     the rank and the cause, and so does a rank started with other sizes
 *     (the load's agreement); neither hangs (timeout(1) around mpirun);
 *   - a rank killed (SIGKILL) while serving, rank 1 (rank 0 idle) or rank 0
 *     (rank 1 inside a collective), ends the whole job with mpirun naming
 *     the rank and the signal, within seconds;
 *   - -tp 2 without mpirun, a world of another size, and mpirun -np 2
 *     without -tp are refused;
 *   - engine_memory_estimate at tp 4 is exactly what rank 0 allocated (the
 *     bytes `minivllm bench` reports from its runner).
 *
 * How mpirun is run here (MPIRUN below): --oversubscribe, since CI has 2
 * cores and tp 4 starts 4 processes; --bind-to none, so those processes are
 * not pinned onto the same core; --mca btl self,vader, shared memory within
 * one host (no network probing in a container); and, as CI runs as root,
 * OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1, which Open MPI
 * requires to start as root at all. --threads 1: one CPU thread per rank.
 * Under SANITIZE=1, LeakSanitizer is off for the ranks (ASAN_OPTIONS,
 * passed on with -x): Open MPI leaves its own allocations at MPI_Finalize,
 * some inside plugins it has unloaded by then, which no suppression can
 * name. AddressSanitizer's other checks and UBSan stay on, and the tp = 1
 * runs here (and every other test) keep leak checking.
 *
 * A build without MPI (no mpicc when it was built) skips these tests saying
 * so, except under MV_REQUIRE_MPI=1 (CI sets it), where that is a failure.
 *
 * Run: make test (or build/tests/test_tp_mpi after make).
 */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "chapters/09-engine/runtime/engine.h"
#include "common/check.h"
#include "tests/helpers.h"

#define MPIRUN                                                                                                       \
    "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 ASAN_OPTIONS=detect_leaks=0 timeout 120 "             \
    "mpirun --oversubscribe --bind-to none --mca btl self,vader -x ASAN_OPTIONS"
#define MAX_CASES 32
#define MAX_IDS 512

// Skip (saying why) or, under MV_REQUIRE_MPI=1, fail when MPI cannot run here.
static void need_mpi(void) {
    const char *req = getenv("MV_REQUIRE_MPI");
    const int required = req && strcmp(req, "1") == 0;
    char out[256];
    const char *why = NULL;
    if (!MV_HAVE_MPI) why = "this build has no MPI (mpicc was not found when it was built)";
    else if (run_command("command -v mpirun >/dev/null 2>&1", out, sizeof out) != 0) why = "mpirun is not on PATH";
    if (!why) return;
    if (required) cr_assert_fail("MV_REQUIRE_MPI=1, and %s: install openmpi-bin libopenmpi-dev and rebuild", why);
    fprintf(stderr, "SKIP: %s, so the tensor-parallel tests are skipped\n", why);
    cr_skip_test("%s", why);
}

typedef struct {
    int n;
    int32_t prompt[MAX_CASES][MAX_IDS], greedy[MAX_CASES][MAX_IDS];
    int n_prompt[MAX_CASES], n_greedy[MAX_CASES];
} golden_t;

static int ids_of(const cJSON *a, int32_t *ids) {
    int n = 0;
    const cJSON *v;
    cJSON_ArrayForEach(v, a) if (n < MAX_IDS) ids[n++] = (int32_t)v->valuedouble;
    return n;
}

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    cr_assert_eq(fread(s, 1, (size_t)n, f), (size_t)n);
    s[n] = '\0';
    fclose(f);
    return s;
}

static void golden_load(const char *model, golden_t *g) {
    char path[256];
    snprintf(path, sizeof path, "%s/golden.json", model);
    char *text = slurp(path);
    cJSON *j = cJSON_Parse(text);
    cr_assert_not_null(j, "%s is not JSON (rerun tests/data/make_tiny_qwen3.py)", path);
    const cJSON *c;
    g->n = 0;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(j, "cases")) {
        cr_assert_lt(g->n, MAX_CASES);
        g->n_prompt[g->n] = ids_of(cJSON_GetObjectItem(c, "prompt_token_ids"), g->prompt[g->n]);
        g->n_greedy[g->n] = ids_of(cJSON_GetObjectItem(c, "greedy_token_ids"), g->greedy[g->n]);
        g->n++;
    }
    cJSON_Delete(j);
    free(text);
    cr_assert_gt(g->n, 0, "%s has no cases", path);
}

// The goldens' prompts as generate's JSONL, greedy, eos ignored.
static void write_requests(const golden_t *g, const char *path) {
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f, "%s", path);
    for (int i = 0; i < g->n; i++) {
        fprintf(f, "{\"prompt_token_ids\": [");
        for (int k = 0; k < g->n_prompt[i]; k++) fprintf(f, k ? ", %d" : "%d", g->prompt[i][k]);
        fprintf(f, "], \"max_tokens\": %d, \"temperature\": 0, \"ignore_eos\": true}\n", g->n_greedy[i]);
    }
    fclose(f);
}

// generate's --ordered JSONL output: line i's token_ids into ids[i].
static int read_outputs(const char *path, int32_t ids[][MAX_IDS], int *n_ids) {
    char *text = slurp(path);
    int n = 0;
    for (char *line = strtok(text, "\n"); line && n < MAX_CASES; line = strtok(NULL, "\n")) {
        cJSON *o = cJSON_Parse(line);
        cr_assert_not_null(o, "%s: not JSON: %s", path, line);
        n_ids[n] = ids_of(cJSON_GetObjectItem(o, "token_ids"), ids[n]);
        n++;
        cJSON_Delete(o);
    }
    free(text);
    return n;
}

// `generate` of the goldens' prompts at tp (1: no mpirun); the outputs in ids.
static int run_generate(const char *model, int tp, const char *in, int32_t ids[][MAX_IDS], int *n_ids,
                        char *log, size_t cap) {
    char out[128], cmd[2048];
    snprintf(out, sizeof out, "/tmp/mv-test-tp-out-%d-%d.jsonl", (int)getpid(), tp);
    remove(out);
    if (tp == 1)
        snprintf(cmd, sizeof cmd, "./%s/minivllm generate --model %s --input %s --output %s --ordered --threads 1 "
                 "--device cpu 2>&1", MV_BUILD_DIR, model, in, out);
    else
        snprintf(cmd, sizeof cmd, MPIRUN " -np %d ./%s/minivllm generate --model %s --input %s --output %s --ordered "
                 "--threads 1 --device cpu -tp %d 2>&1", tp, MV_BUILD_DIR, model, in, out, tp);
    int st = run_command(cmd, log, cap);
    if (st != 0) return st;
    int n = read_outputs(out, ids, n_ids);
    remove(out);
    return n;
}

static void check_tp_equals_tp1_and_golden(const char *model, const int *tps, int n_tps) {
    need_mpi();
    golden_t *g = calloc(1, sizeof *g);
    golden_load(model, g);
    char in[128];
    snprintf(in, sizeof in, "/tmp/mv-test-tp-in-%d.jsonl", (int)getpid());
    write_requests(g, in);
    static char log[1 << 16];
    static int32_t ref[MAX_CASES][MAX_IDS], got[MAX_CASES][MAX_IDS];
    int n_ref[MAX_CASES], n_got[MAX_CASES];
    int n = run_generate(model, 1, in, ref, n_ref, log, sizeof log);
    cr_assert_eq(n, g->n, "%s tp 1: %d outputs for %d requests:\n%s", model, n, g->n, log);
    for (int i = 0; i < n; i++)
        cr_assert(n_ref[i] == g->n_greedy[i] && !memcmp(ref[i], g->greedy[i], sizeof(int32_t) * (size_t)n_ref[i]),
                  "%s tp 1, request %d differs from the golden", model, i);
    for (int t = 0; t < n_tps; t++) {
        n = run_generate(model, tps[t], in, got, n_got, log, sizeof log);
        cr_assert_eq(n, g->n, "%s tp %d: %d outputs for %d requests (mpirun's output:)\n%s", model, tps[t], n, g->n,
                     log);
        for (int i = 0; i < n; i++)
            cr_expect(n_got[i] == n_ref[i] && !memcmp(got[i], ref[i], sizeof(int32_t) * (size_t)n_ref[i]),
                      "%s tp %d, request %d: not tp 1's greedy ids", model, tps[t], i);
    }
    remove(in);
    free(g);
}

Test(tp_mpi, tied_tp2_tp4_match_tp1_and_hf) {
    const int tps[] = {2, 4};  // 2 KV heads: split at tp 2, each on 2 ranks at tp 4
    check_tp_equals_tp1_and_golden("tests/data/tiny-qwen3-tied", tps, 2);
}

Test(tp_mpi, untied_tp2_tp4_copy_the_one_kv_head) {
    const int tps[] = {2, 4};
    check_tp_equals_tp1_and_golden("tests/data/tiny-qwen3-untied", tps, 2);
}

Test(tp_mpi, mha_tp2_matches_tp1_and_hf) {
    const int tps[] = {2};
    check_tp_equals_tp1_and_golden("tests/data/tiny-qwen3-mha", tps, 1);
}

// ---- random weights: the same model at every tp ---------------------------------------------

// A .npy file's float32 data (numpy format 1.0 or 2.0, as generate's
// --logits-out writes it); *n values. The caller frees it.
static float *npy_floats(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "cannot open %s", path);
    unsigned char head[12];
    cr_assert_eq(fread(head, 1, sizeof head, f), sizeof head);
    cr_assert(memcmp(head, "\x93NUMPY", 6) == 0, "%s is not a .npy file", path);
    const long data = head[6] == 1 ? 10L + (head[8] | head[9] << 8)
                                   : 12L + (head[8] | head[9] << 8 | (long)head[10] << 16 | (long)head[11] << 24);
    fseek(f, 0, SEEK_END);
    const long end = ftell(f);
    *n = (size_t)(end - data) / sizeof(float);
    float *v = malloc(*n * sizeof *v + 1);
    fseek(f, data, SEEK_SET);
    cr_assert_eq(fread(v, sizeof *v, *n, f), *n);
    fclose(f);
    return v;
}

// Tolerance: the CPU backend's ranks add fp32 partial sums, so tp 2 differs
// from tp 1 by summation order only (the golden tests above see no id
// change); 1e-9 NMSE is the bound build/engine_check uses for that. A shard
// drawn from another model, or misplaced, gives NMSE of order 1.
#define TP_RANDOM_LOGITS_NMSE_TOL 1e-9

Test(tp_mpi, random_weights_tp2_first_logits_equal_tp1) {
    need_mpi();
    // tiny-qwen3-untied's shapes (its config.json only is read): an untied LM
    // head and a KV head copied on both ranks.
    char in[128], l1[128], l2[128], cmd[2048];
    static char log[1 << 16];
    snprintf(in, sizeof in, "/tmp/mv-test-tp-rw-in-%d.jsonl", (int)getpid());
    snprintf(l1, sizeof l1, "/tmp/mv-test-tp-rw-1-%d.npy", (int)getpid());
    snprintf(l2, sizeof l2, "/tmp/mv-test-tp-rw-2-%d.npy", (int)getpid());
    FILE *f = fopen(in, "w");
    cr_assert_not_null(f);
    fputs("{\"prompt_token_ids\": [5, 6, 7, 300], \"max_tokens\": 1, \"temperature\": 0}\n"
          "{\"prompt_token_ids\": [41], \"max_tokens\": 1, \"temperature\": 0}\n", f);
    fclose(f);
    const char *args = "generate --model tests/data/tiny-qwen3-untied --random-weights --seed 3 --device cpu "
                       "--threads 1 --ordered --output /dev/null";
    snprintf(cmd, sizeof cmd, "./%s/minivllm %s --input %s --logits-out %s 2>&1", MV_BUILD_DIR, args, in, l1);
    cr_assert_eq(run_command(cmd, log, sizeof log), 0, "tp 1:\n%s", log);
    snprintf(cmd, sizeof cmd, MPIRUN " -np 2 ./%s/minivllm %s -tp 2 --input %s --logits-out %s 2>&1", MV_BUILD_DIR,
             args, in, l2);
    cr_assert_eq(run_command(cmd, log, sizeof log), 0, "tp 2:\n%s", log);
    size_t n1 = 0, n2 = 0;
    float *a = npy_floats(l1, &n1), *b = npy_floats(l2, &n2);
    cr_assert(n1 == n2 && n1 > 0, "tp 1 wrote %zu logits, tp 2 %zu", n1, n2);
    double err = 0, ref = 0;
    for (size_t i = 0; i < n1; i++) {
        cr_assert(isfinite(a[i]) && isfinite(b[i]), "logit %zu is not finite (tp 1 %g, tp 2 %g)", i, a[i], b[i]);
        err += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        ref += (double)a[i] * a[i];
    }
    cr_assert(ref > 0, "tp 1's logits are all zero");
    cr_expect(err / ref <= TP_RANDOM_LOGITS_NMSE_TOL, "tp 2 vs tp 1 first-step logits: NMSE %.3e > %g", err / ref,
              TP_RANDOM_LOGITS_NMSE_TOL);
    free(a);
    free(b);
    remove(in);
    remove(l1);
    remove(l2);
}

// ---- refusals and failures --------------------------------------------------------------

static char *request_file(void) {
    static char in[128];
    snprintf(in, sizeof in, "/tmp/mv-test-tp-req-%d.jsonl", (int)getpid());
    FILE *f = fopen(in, "w");
    cr_assert_not_null(f);
    fputs("{\"prompt_token_ids\": [5, 6, 7], \"max_tokens\": 4, \"temperature\": 0}\n", f);
    fclose(f);
    return in;
}

Test(tp_mpi, tp_that_does_not_divide_the_heads_is_refused) {
    need_mpi();
    static char log[1 << 16];
    char cmd[1024];
    // tiny-qwen3-mha has 2 attention heads: tp 4 would split a head.
    snprintf(cmd, sizeof cmd, MPIRUN " -np 4 ./%s/minivllm generate --model tests/data/tiny-qwen3-mha --input %s "
             "--threads 1 --device cpu -tp 4 2>&1", MV_BUILD_DIR, request_file());
    int st = run_command(cmd, log, sizeof log);
    cr_expect(st != 0 && st != 124, "exit %d (124: timed out):\n%s", st, log);
    cr_expect(strstr(log, "num_attention_heads 2") != NULL, "%s", log);
}

Test(tp_mpi, a_rank_without_weights_stops_every_rank) {
    need_mpi();
    // Rank 1's --model: the same config, no model.safetensors.
    char dir[128], cmd[2048];
    static char log[1 << 16];
    snprintf(dir, sizeof dir, "/tmp/mv-test-tp-noweights-%d", (int)getpid());
    snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir -p %s && cp tests/data/tiny-qwen3-tied/*config.json %s/", dir, dir,
             dir);
    cr_assert_eq(run_command(cmd, log, sizeof log), 0, "%s", log);
    const char *in = request_file();
    snprintf(cmd, sizeof cmd,
             MPIRUN " -np 1 ./%s/minivllm generate --model tests/data/tiny-qwen3-tied --input %s --threads 1 "
             "--device cpu -tp 2 : -np 1 ./%s/minivllm generate --model %s --input %s --threads 1 --device cpu -tp 2 2>&1",
             MV_BUILD_DIR, in, MV_BUILD_DIR, dir, in);
    int st = run_command(cmd, log, sizeof log);
    cr_expect(st != 0 && st != 124, "exit %d (124: timed out):\n%s", st, log);
    cr_expect(strstr(log, "tp rank 1") != NULL && strstr(log, "model.safetensors") != NULL,
              "no message naming rank 1 and the missing weights:\n%s", log);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    run_command(cmd, log, sizeof log);
}

Test(tp_mpi, a_rank_with_other_sizes_fails_the_load_agreement) {
    need_mpi();
    static char log[1 << 16];
    char cmd[2048];
    const char *in = request_file();
    snprintf(cmd, sizeof cmd,
             MPIRUN " -np 1 ./%s/minivllm generate --model tests/data/tiny-qwen3-tied --input %s --threads 1 "
             "--device cpu -tp 2 : -np 1 ./%s/minivllm generate --model tests/data/tiny-qwen3-tied --input %s "
             "--threads 1 --device cpu -tp 2 --num-blocks 40 2>&1",
             MV_BUILD_DIR, in, MV_BUILD_DIR, in);
    int st = run_command(cmd, log, sizeof log);
    cr_expect(st != 0 && st != 124, "exit %d (124: timed out):\n%s", st, log);
    cr_expect(strstr(log, "rank 1: ") != NULL && strstr(log, "differ from rank 0") != NULL, "%s", log);
}

Test(tp_mpi, tp2_without_mpirun_or_in_a_world_of_another_size_is_refused) {
    need_mpi();
    static char log[1 << 16];
    char cmd[1024];
    const char *in = request_file();
    // Not started by mpirun (its variables removed, as a plain shell has none).
    snprintf(cmd, sizeof cmd, "env -u OMPI_COMM_WORLD_SIZE -u PMIX_RANK -u PMI_SIZE timeout 60 ./%s/minivllm generate "
             "--model tests/data/tiny-qwen3-tied --input %s --device cpu -tp 2 2>&1", MV_BUILD_DIR, in);
    int st = run_command(cmd, log, sizeof log);
    cr_expect_eq(st, 1, "%s", log);
    cr_expect(strstr(log, "mpirun -np 2") != NULL, "%s", log);
    snprintf(cmd, sizeof cmd, MPIRUN " -np 2 ./%s/minivllm generate --model tests/data/tiny-qwen3-tied --input %s "
             "--threads 1 --device cpu -tp 4 2>&1", MV_BUILD_DIR, in);
    st = run_command(cmd, log, sizeof log);
    cr_expect(st != 0 && st != 124, "exit %d:\n%s", st, log);
    cr_expect(strstr(log, "needs 4 ranks, and mpirun started 2") != NULL, "%s", log);
    // Two ranks and no -tp: two copies of the whole job, refused.
    snprintf(cmd, sizeof cmd, MPIRUN " -np 2 ./%s/minivllm generate --model tests/data/tiny-qwen3-tied --input %s "
             "--threads 1 --device cpu 2>&1", MV_BUILD_DIR, in);
    st = run_command(cmd, log, sizeof log);
    cr_expect(st != 0 && st != 124, "exit %d:\n%s", st, log);
    cr_expect(strstr(log, "give -tp 2") != NULL, "%s", log);
}

Test(tp_mpi, memory_estimate_is_rank_0s_exact_share) {
    need_mpi();
    const char *model = "tests/data/tiny-qwen3-untied";  // tp 4: the KV head copied, the LM head untied
    engine_config_t c = engine_config_default(model);
    c.device = RUNNER_DEVICE_CPU;
    c.tp_size = 4;
    c.num_threads = 1;
    qwen3_config_t m;
    engine_memory_t mem;
    cr_assert(qwen3_config_load(model, &m) == 0 && engine_config_resolve(&c, &m) == 0 &&
              engine_memory_estimate(&c, &m, &mem) == 0, "%s", mv_last_error());
    static char log[1 << 16];
    char cmd[1024];
    snprintf(cmd, sizeof cmd, MPIRUN " -np 4 ./%s/minivllm bench --model %s --device cpu -tp 4 --threads 1 "
             "--num-seqs 4 --min-len 8 --max-len 32 --repeat 1 --no-warmup 2>&1", MV_BUILD_DIR, model);
    cr_assert_eq(run_command(cmd, log, sizeof log), 0, "%s", log);
    const char *at = strstr(log, "weights ");
    size_t w = 0, kv = 0, sc = 0;
    cr_assert(at && sscanf(at, "weights %zu, KV cache %zu, scratch %zu", &w, &kv, &sc) == 3, "%s", log);
    cr_expect_eq(w, mem.runner.weight_bytes);
    cr_expect_eq(kv, mem.runner.kv_cache_bytes);
    cr_expect_eq(sc, mem.runner.scratch_bytes);
}

// A rank that dies (SIGKILL: no message of its own, no MPI_Abort) stops the
// whole job, never a hang: `minivllm serve -tp 2` is started, and once it
// serves, rank `victim` is killed. Killing rank 1 leaves rank 0 idle in its
// HTTP loop; killing rank 0 leaves rank 1 inside a collective (MPI_Bcast,
// waiting for the next step). Either way mpirun ends every rank and says
// which one died and how, within seconds (timeout(1) would give 124).
static void kill_one_rank(int victim) {
    static char log[1 << 16];
    char cmd[4096], out[128];
    snprintf(out, sizeof out, "/tmp/mv-test-tp-kill-%d-%d.log", victim, (int)getpid());
    // --served-model-name makes these processes' command line unique, for pgrep.
    snprintf(cmd, sizeof cmd,
             "(" MPIRUN " -np 2 ./%s/minivllm serve --model tests/data/tiny-qwen3-tied --device cpu -tp 2 --threads 1 "
             "--port 0 --served-model-name tp-kill-%d-%d > %s 2>&1; echo \"mpirun exit $?\" >> %s) & "
             "for i in $(seq 600); do grep -q 'serving on' %s && break; sleep 0.1; done; "
             "for p in $(pgrep -f 'served-model-name tp-kill-%d-%d'); do "
             "  tr '\\0' '\\n' < /proc/$p/environ 2>/dev/null | grep -qx 'OMPI_COMM_WORLD_RANK=%d' && kill -9 $p; done; "
             "wait; cat %s",
             MV_BUILD_DIR, victim, (int)getpid(), out, out, out, victim, (int)getpid(), victim, out);
    run_command(cmd, log, sizeof log);
    remove(out);
    char rank[64];
    snprintf(rank, sizeof rank, "rank %d", victim);
    cr_expect(strstr(log, "serving on") != NULL, "the server never started:\n%s", log);
    cr_expect(strstr(log, rank) && strstr(log, "signal 9"), "mpirun does not say that %s died of signal 9:\n%s",
              rank, log);
    const char *ex = strstr(log, "mpirun exit ");
    cr_expect(ex && atoi(ex + 12) != 0 && atoi(ex + 12) != 124, "mpirun's exit (0 or a timeout):\n%s", log);
}

Test(tp_mpi, a_rank_that_dies_stops_every_rank) {
    need_mpi();
    kill_one_rank(1);
    kill_one_rank(0);
}
