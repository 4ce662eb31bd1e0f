/*
 * tests/test_reliability.c - nothing lost at the end of a run, and one bad
 * request never sinks a batch: `minivllm generate` and `minivllm bench` on
 * the command line (chapters/09-engine/cli/).
 *
 *   - results are written as requests finish, in finish order (--ordered:
 *     input order), each line whole; --output is checked before the model
 *     loads;
 *   - a write error (a full device, a file-size limit) stops the run with a
 *     message and leaves only whole lines;
 *   - SIGINT / SIGTERM: what had finished is written, the rest named, exit
 *     130 / 143, no --logits-out or --json half written;
 *   - a request whose logits turn NaN fails alone ("finish_reason":"error");
 *   - a load that cannot fit in memory is refused with the numbers;
 *   - request lines: a NUL in a string, NUL bytes, a key twice, a read error.
 *
 * Run: make test (or build/tests/test_reliability after make).
 */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/helpers.h"

#define TINY "tests/data/tiny-qwen3-tied"
#define UNTIED "tests/data/tiny-qwen3-untied"

static char tmp[64];

static void make_tmp(void) {
    strcpy(tmp, "/tmp/mv_rel_XXXXXX");
    cr_assert(mkdtemp(tmp));
}

static void remove_tmp(void) {
    char cmd[128], out[64];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    run_command(cmd, out, sizeof out);
}

TestSuite(generate, .init = make_tmp, .fini = remove_tmp);
TestSuite(bench_reliability, .init = make_tmp, .fini = remove_tmp);

static void path_in(char *out, size_t cap, const char *name) { snprintf(out, cap, "%s/%s", tmp, name); }

static void write_text(const char *path, const char *text, size_t n) {
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f, "%s", path);
    cr_assert_eq(fwrite(text, 1, n, f), n);
    fclose(f);
}

static char *read_all(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    static char buf[1 << 20];
    *n = fread(buf, 1, sizeof buf - 1, f);
    buf[*n] = '\0';
    fclose(f);
    return buf;
}

// n requests of 20 prompt ids each, max_tokens tokens, ignore_eos.
static void write_requests(const char *path, int n, int max_tokens) {
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    for (int i = 0; i < n; i++) {
        fprintf(f, "{\"prompt_token_ids\": [");
        for (int k = 0; k < 20; k++) fprintf(f, k ? ", %d" : "%d", (i * 7 + k) % 500 + 5);
        fprintf(f, "], \"max_tokens\": %d, \"ignore_eos\": true}\n", max_tokens);
    }
    fclose(f);
}

// Every line of path is a whole JSON object ending in '\n'; their indices in *idx (count returned).
static int whole_lines(const char *path, int *idx, int cap) {
    size_t n;
    char *s = read_all(path, &n);
    cr_assert_not_null(s, "%s missing", path);
    cr_expect(n == 0 || s[n - 1] == '\n', "%s ends in a cut line: ...%s", path, n > 40 ? s + n - 40 : s);
    int k = 0;
    for (char *line = s; *line;) {
        char *nl = strchr(line, '\n');
        cr_assert_not_null(nl, "a cut last line: %s", line);
        *nl = '\0';
        cJSON *o = cJSON_Parse(line);
        cr_assert(cJSON_IsObject(o), "not a whole JSON line: %s", line);
        if (k < cap) idx[k] = (int)cJSON_GetObjectItem(o, "index")->valuedouble;
        k++;
        cJSON_Delete(o);
        line = nl + 1;
    }
    return k;
}

// ./minivllm ARGS in the background, stdout and stderr into files; its pid.
static pid_t spawn(const char *args, const char *out_path, const char *err_path) {
    pid_t pid = fork();
    cr_assert_neq(pid, -1);
    if (pid == 0) {
        setenv("CUDA_VISIBLE_DEVICES", "", 1);
        int o = open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0644), e = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(o, 1);
        dup2(e, 2);
        char cmd[2048];
        snprintf(cmd, sizeof cmd, "exec ./%s/minivllm %s", MV_BUILD_DIR, args);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    return pid;
}

// Wait until path has at least `lines` lines (or 120 s).
static void wait_for_lines(const char *path, int lines, pid_t pid) {
    for (int t = 0; t < 12000; t++) {
        size_t n;
        char *s = read_all(path, &n);
        int k = 0;
        for (size_t i = 0; s && i < n; i++) k += s[i] == '\n';
        if (k >= lines) return;
        int st;
        cr_assert_eq(waitpid(pid, &st, WNOHANG), 0, "minivllm ended before %d lines were written", lines);
        usleep(10000);
    }
    cr_assert_fail("%s never got %d lines", path, lines);
}

// A copy of s cut to cap - 1 bytes.
static void copy_str(char *dst, size_t cap, const char *s) {
    size_t n = strlen(s) < cap - 1 ? strlen(s) : cap - 1;
    memcpy(dst, s, n);
    dst[n] = '\0';
}

static int wait_exit(pid_t pid) {
    int st;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    cr_assert(WIFEXITED(st), "minivllm was killed by signal %d instead of exiting", WIFSIGNALED(st) ? WTERMSIG(st) : 0);
    return WEXITSTATUS(st);
}

static int minivllm(const char *args, char *out, size_t cap) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "./%s/minivllm %s 2>&1", MV_BUILD_DIR, args);
    return run_command(cmd, out, cap);
}

// ---- order and streaming ---------------------------------------------------------------------

// demo.jsonl: request 0 generates 12 tokens, 1 and 2 stop at 10. As they
// finish: 1, 2, 0; --ordered: 0, 1, 2. The lines are the same either way.
Test(generate, results_in_finish_order_or_input_order) {
    char out[256], args[1024], buf[8192];
    path_in(out, sizeof out, "out.jsonl");
    int idx[8];
    snprintf(args, sizeof args, "generate --model %s --input chapters/09-engine/demo.jsonl --output %s", TINY, out);
    cr_assert_eq(minivllm(args, buf, sizeof buf), 0, "%s", buf);
    cr_assert_eq(whole_lines(out, idx, 8), 3);
    cr_expect(idx[0] == 1 && idx[1] == 2 && idx[2] == 0, "finish order: %d %d %d", idx[0], idx[1], idx[2]);
    size_t n;
    char first[4096];
    copy_str(first, sizeof first, read_all(out, &n));
    snprintf(args, sizeof args, "generate --model %s --input chapters/09-engine/demo.jsonl --output %s --ordered", TINY,
             out);
    cr_assert_eq(minivllm(args, buf, sizeof buf), 0, "%s", buf);
    cr_assert_eq(whole_lines(out, idx, 8), 3);
    cr_expect(idx[0] == 0 && idx[1] == 1 && idx[2] == 2, "--ordered: %d %d %d", idx[0], idx[1], idx[2]);
    char *ordered = read_all(out, &n);
    // The same three lines: line 1 of the finish order is line 2 of input order, and so on.
    char *l0 = strstr(first, "{\"index\":0,");
    cr_assert_not_null(l0);
    cr_expect(strncmp(ordered, l0, (size_t)(strchr(l0, '\n') - l0)) == 0, "%s\nvs\n%s", first, ordered);
}

// --output is opened before anything loads: a directory without weights
// fails on the output path, not on the weights.
Test(generate, output_checked_before_the_model_loads) {
    char args[1024], buf[8192];
    snprintf(args, sizeof args,
             "generate --model tests/data/qwen3-0.6b-shape --input chapters/09-engine/demo.jsonl --output "
             "%s/no/such/dir/out.jsonl",
             tmp);
    cr_expect_eq(minivllm(args, buf, sizeof buf), 1, "%s", buf);
    cr_expect(strstr(buf, "cannot open") && strstr(buf, "/no/such/dir/out.jsonl") && !strstr(buf, "safetensors"),
              "%s", buf);
    snprintf(args, sizeof args, "generate --model %s --input chapters/09-engine/demo.jsonl --output %s", TINY, tmp);
    cr_expect_eq(minivllm(args, buf, sizeof buf), 1, "%s", buf);
    cr_expect(strstr(buf, "is a directory"), "%s", buf);
}

// A full device: the first line cannot be written; a message, exit 1.
// A size limit (ulimit -f) mid-run: the line that crosses it is cut back
// off, the file ends with a whole line, and the run stops.
Test(generate, write_error_stops_with_only_whole_lines) {
    char in[256], out[256], args[1024], buf[8192];
    path_in(in, sizeof in, "in.jsonl");
    path_in(out, sizeof out, "out.jsonl");
    write_requests(in, 50, 8);
    snprintf(args, sizeof args, "generate --model %s --input %s --output /dev/full", TINY, in);
    cr_expect_eq(minivllm(args, buf, sizeof buf), 1, "%s", buf);
    cr_expect(strstr(buf, "cannot write /dev/full: No space left on device"), "%s", buf);
    char cmd[2048];
    // 4 blocks of 512 bytes: about 20 of the 50 lines fit.
    snprintf(cmd, sizeof cmd, "ulimit -f 4; ./%s/minivllm generate --model %s --input %s --output %s 2>&1",
             MV_BUILD_DIR, TINY, in, out);
    cr_expect_eq(run_command(cmd, buf, sizeof buf), 1, "%s", buf);
    cr_expect(strstr(buf, "cannot write") && strstr(buf, "File too large") && strstr(buf, "nothing cut"), "%s", buf);
    int idx[64];
    int k = whole_lines(out, idx, 64);
    cr_expect(k > 5 && k < 50, "%d lines written", k);
    struct stat st;
    cr_assert_eq(stat(out, &st), 0);
    cr_expect_leq(st.st_size, 2048, "past the size limit");
}

// SIGINT (and SIGTERM) mid-run: the finished results are whole lines in the
// file, the unfinished are named, and the exit status is 128 + the signal;
// --logits-out leaves nothing behind. With --ordered the finished ones held
// back are written at the stop.
static void stop_mid_run(int sig, int ordered) {
    char in[256], out[256], err[256], npy[256], stdout_path[256], args[2048];
    path_in(in, sizeof in, "big.jsonl");
    path_in(out, sizeof out, "out.jsonl");
    path_in(err, sizeof err, "err.txt");
    path_in(npy, sizeof npy, "logits.npy");
    path_in(stdout_path, sizeof stdout_path, "stdout.txt");
    write_requests(in, 300, 300);
    snprintf(args, sizeof args,
             "generate --model %s --input %s --output %s --max-num-seqs 4 --max-model-len 512 --logits-out %s %s",
             TINY, in, out, npy, ordered ? "--ordered" : "");
    pid_t pid = spawn(args, stdout_path, err);
    wait_for_lines(out, 4, pid);
    kill(pid, sig);
    int rc = wait_exit(pid);
    cr_expect_eq(rc, 128 + sig, "exit status %d", rc);
    int idx[300];
    int k = whole_lines(out, idx, 300);
    cr_expect(k >= 4 && k < 300, "%d lines", k);
    for (int i = 1; ordered && i < k; i++) cr_expect_lt(idx[i - 1], idx[i], "--ordered wrote %d before %d", idx[i - 1], idx[i]);
    size_t n;
    char *e = read_all(err, &n);
    char want[128];
    snprintf(want, sizeof want, "stopped by %s", sig == SIGINT ? "SIGINT" : "SIGTERM");
    cr_expect(strstr(e, want) && strstr(e, "did not:") && strstr(e, "big.jsonl:"), "%s", e);
    cr_expect(strstr(e, "--logits-out") && strstr(e, "not written"), "%s", e);
    char cmd[512], ls[1024];
    snprintf(cmd, sizeof cmd, "ls %s", tmp);
    run_command(cmd, ls, sizeof ls);
    cr_expect(!strstr(ls, "logits.npy"), "--logits-out left %s", ls);
}

Test(generate, sigint_writes_what_finished_and_exits_130) { stop_mid_run(SIGINT, 0); }
Test(generate, sigterm_with_ordered_exits_143) { stop_mid_run(SIGTERM, 1); }

// ---- isolation --------------------------------------------------------------------------------

// tests/data/tiny-qwen3-untied with its embedding row 100 set to NaN: a
// request holding id 100 fails alone.
static void write_poisoned_model(const char *dir) {
    char cmd[1024], out[256];
    snprintf(cmd, sizeof cmd, "mkdir -p %s && cp %s/config.json %s/generation_config.json %s/model.safetensors %s/",
             dir, UNTIED, UNTIED, UNTIED, dir);
    cr_assert_eq(run_command(cmd, out, sizeof out), 0, "%s", out);
    char path[512];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    FILE *f = fopen(path, "r+b");
    cr_assert_not_null(f);
    uint64_t hlen;
    cr_assert_eq(fread(&hlen, 8, 1, f), 1u);
    char *h = calloc(1, hlen + 1);
    cr_assert_eq(fread(h, 1, hlen, f), hlen);
    cJSON *j = cJSON_Parse(h);
    cJSON *t = cJSON_GetObjectItem(j, "model.embed_tokens.weight");
    cr_assert_not_null(t);
    long begin = (long)cJSON_GetArrayItem(cJSON_GetObjectItem(t, "data_offsets"), 0)->valuedouble;
    long H = (long)cJSON_GetArrayItem(cJSON_GetObjectItem(t, "shape"), 1)->valuedouble;
    cr_assert_eq(fseek(f, 8 + (long)hlen + begin + 100 * H * 2, SEEK_SET), 0);
    for (long k = 0; k < H; k++) fwrite("\xc0\x7f", 1, 2, f);  // bf16 NaN
    fclose(f);
    cJSON_Delete(j);
    free(h);
}

Test(generate, a_request_with_nan_logits_fails_alone) {
    char dir[256], in[256], out[256], args[1024], buf[8192];
    path_in(dir, sizeof dir, "nan-model");
    path_in(in, sizeof in, "in.jsonl");
    path_in(out, sizeof out, "out.jsonl");
    write_poisoned_model(dir);
    const char *reqs = "{\"prompt_token_ids\": [7, 8], \"max_tokens\": 4, \"temperature\": 0}\n"
                       "{\"prompt_token_ids\": [7, 100], \"max_tokens\": 4}\n"
                       "{\"prompt_token_ids\": [9], \"max_tokens\": 3, \"temperature\": 0}\n";
    write_text(in, reqs, strlen(reqs));
    snprintf(args, sizeof args, "generate --model %s --input %s --output %s --ordered", dir, in, out);
    cr_expect_eq(minivllm(args, buf, sizeof buf), 1, "%s", buf);
    cr_expect(strstr(buf, "1 of 3 requests failed") && strstr(buf, "in.jsonl:2"), "%s", buf);
    int idx[4];
    cr_assert_eq(whole_lines(out, idx, 4), 3);
    size_t n;
    char *s = read_all(out, &n);
    char *l1 = strstr(s, "{\"index\":1,");
    cr_assert_not_null(l1, "%s", s);
    cr_expect(strstr(l1, "\"finish_reason\":\"error\",\"error\":\"generated token 0:") && strstr(l1, "no finite"),
              "%s", s);
    // The others are what the unpoisoned model gives them.
    char clean[256], want[4096];
    path_in(clean, sizeof clean, "clean.jsonl");
    snprintf(args, sizeof args, "generate --model %s --input %s --output %s --ordered", UNTIED, in, clean);
    cr_assert_eq(minivllm(args, buf, sizeof buf), 0, "%s", buf);
    copy_str(want, sizeof want, read_all(clean, &n));
    s = read_all(out, &n);
    char *w0 = want, *w2 = strstr(want, "{\"index\":2,"), *g2 = strstr(s, "{\"index\":2,");
    cr_assert(w2 && g2);
    cr_expect(strncmp(s, w0, (size_t)(strchr(w0, '\n') - w0)) == 0, "request 0: %s vs %s", s, want);
    cr_expect(strncmp(g2, w2, (size_t)(strchr(w2, '\n') - w2)) == 0, "request 2: %s vs %s", s, want);
}

// ---- memory ---------------------------------------------------------------------------------

// A model no machine holds (a 2 TB embedding): refused at once, before the
// weights are even looked for, naming the bytes, rather than killed.
Test(generate, a_load_that_cannot_fit_is_refused_with_the_numbers) {
    char dir[256], path[300], args[1024], buf[8192];
    path_in(dir, sizeof dir, "huge");
    cr_assert_eq(mkdir(dir, 0755), 0);
    snprintf(path, sizeof path, "%s/config.json", dir);
    const char *cfg = "{\"architectures\": [\"Qwen3ForCausalLM\"], \"vocab_size\": 16777216, \"hidden_size\": 65536, "
                      "\"intermediate_size\": 65536, \"num_hidden_layers\": 1, \"num_attention_heads\": 512, "
                      "\"num_key_value_heads\": 8, \"head_dim\": 128, \"rms_norm_eps\": 1e-06, \"rope_theta\": 1e6, "
                      "\"max_position_embeddings\": 4096, \"tie_word_embeddings\": true}";
    write_text(path, cfg, strlen(cfg));
    snprintf(args, sizeof args, "generate --model %s --input chapters/09-engine/demo.jsonl", dir);
    cr_expect_eq(minivllm(args, buf, sizeof buf), 1, "%s", buf);
    cr_expect(strstr(buf, "needs at least") && strstr(buf, "bytes of host memory") && strstr(buf, "are available") &&
                  strstr(buf, "weights 2088.") && !strstr(buf, "safetensors"),
              "%s", buf);
    // bench with random weights: refused before the weights are drawn (seconds for 0.6B otherwise).
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    snprintf(args, sizeof args,
             "bench --model tests/data/qwen3-0.6b-shape --random-weights --device cpu --max-num-batched-tokens "
             "16000000 --num-seqs 2 --max-len 100");
    cr_expect_eq(minivllm(args, buf, sizeof buf), 1, "%s", buf);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    cr_expect(strstr(buf, "random weights") && strstr(buf, "needs at least"), "%s", buf);
    cr_expect_lt((double)(t1.tv_sec - t0.tv_sec), 3.0, "the refusal came after the weights were drawn");
}

// ---- request lines --------------------------------------------------------------------------

Test(generate, input_lines_nul_duplicates_and_read_errors) {
    char in[256], args[1024], buf[8192];
    path_in(in, sizeof in, "in.jsonl");
    static const struct { const char *line; size_t len; const char *error; } cases[] = {
        {"{\"prompt_token_ids\": [1, 2], \"max_tokens\": 2, \"max_tokens\": 3}", 0, "key \"max_tokens\" appears twice"},
        {"{\"prompt\": \"a\\u0000b\"}", 0, "prompt holds a NUL character"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"x\\u0000\"}]}", 0, "messages[0].content holds a NUL"},
        {"{\"prompt_token_ids\": [1], \"a\\u0000\": 1}", 0, "a key of the top-level value holds a NUL"},
        // A \u without four hex digits: cJSON reads it as U+0000 (found by tests/test_fuzz.c's fuzz_requests,
        // whose input, a raw NUL after the escape, the line reader refuses before any JSON).
        {"{\"prompt\": \"x\\u\\\\\\\\y\"}", 0, "prompt holds a NUL character"},
        {"{\"prompt\": \"a\\u12g4b\"}", 0, "prompt holds a NUL character"},
        {"\0\0\0\0", 4, "a NUL byte at column 1"},
        {"{\"prompt_token_ids\": [1, 2]}\0 junk", 33, "a NUL byte at column 29"},
        {"{\"prompt_token_ids\": [1]} {\"prompt_token_ids\": [2]}", 0, "one JSON value a line"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        char text[256];
        size_t n = cases[k].len ? cases[k].len : strlen(cases[k].line);
        memcpy(text, "{\"prompt_token_ids\": [5]}\n", 26);
        memcpy(text + 26, cases[k].line, n);
        text[26 + n] = '\n';
        write_text(in, text, 27 + n);
        snprintf(args, sizeof args, "generate --model %s --input %s", TINY, in);
        cr_expect_eq(minivllm(args, buf, sizeof buf), 1, "case %zu: %s", k, buf);
        char where[300];
        snprintf(where, sizeof where, "%s:2: ", in);
        cr_expect(strstr(buf, where) && strstr(buf, cases[k].error), "case %zu: %s", k, buf);
    }
    // A directory reads as an error, not as an empty file.
    snprintf(args, sizeof args, "generate --model %s --input %s", TINY, tmp);
    cr_expect_eq(minivllm(args, buf, sizeof buf), 1, "%s", buf);
    cr_expect(strstr(buf, "cannot read") && strstr(buf, "Is a directory"), "%s", buf);
}

Test(generate, version) {
    char buf[1024];
    cr_expect_eq(minivllm("--version", buf, sizeof buf), 0, "%s", buf);
    cr_expect(strncmp(buf, "minivllm 0.", 11) == 0 && strstr(buf, "CUDA:"), "%s", buf);
}

// ---- bench ----------------------------------------------------------------------------------

// --json is written whole or not at all: a bad path fails first; a good one
// holds one JSON document and no temporary file is left beside it.
Test(bench_reliability, json_whole_or_not_at_all) {
    char json[256], args[1024], buf[16384];
    path_in(json, sizeof json, "b.json");
    snprintf(args, sizeof args, "bench --model %s --num-seqs 3 --max-len 8 --min-len 4 --repeat 1 --json %s", TINY,
             json);
    cr_assert_eq(minivllm(args, buf, sizeof buf), 0, "%s", buf);
    size_t n;
    cJSON *j = cJSON_Parse(read_all(json, &n));
    cr_assert_not_null(j);
    cr_expect(cJSON_IsFalse(cJSON_GetObjectItem(j, "interrupted")));
    cr_expect(cJSON_IsNull(cJSON_GetObjectItem(j, "unknown_token_ids")), "no tokenizer: not counted");
    cJSON_Delete(j);
    char cmd[512], ls[1024];
    snprintf(cmd, sizeof cmd, "ls %s", tmp);
    run_command(cmd, ls, sizeof ls);
    cr_expect_str_eq(ls, "b.json\n");
    snprintf(args, sizeof args, "bench --model %s --num-seqs 3 --max-len 8 --min-len 4 --json %s", TINY, tmp);
    cr_expect_eq(minivllm(args, buf, sizeof buf), 1, "%s", buf);
    cr_expect(strstr(buf, "--json") && strstr(buf, "is a directory"), "%s", buf);
}

// SIGINT during the timed repetitions: the finished ones are reported (and
// in --json with "interrupted": true), exit 130.
Test(bench_reliability, sigint_reports_the_finished_repetitions) {
    char json[256], out[256], err[256], args[1024];
    path_in(json, sizeof json, "b.json");
    path_in(out, sizeof out, "stdout.txt");
    path_in(err, sizeof err, "stderr.txt");
    snprintf(args, sizeof args,
             "bench --model %s --num-seqs 4 --prompt-len 8 --output-len 100 --max-model-len 512 --repeat 1000 "
             "--no-warmup --json %s",
             TINY, json);
    pid_t pid = spawn(args, out, err);
    // Let a few repetitions finish: each is about 0.05 s (0.3 s under ASan), all 1000 far more than 4 s.
    struct timespec d = {4, 0};
    nanosleep(&d, NULL);
    kill(pid, SIGINT);
    cr_expect_eq(wait_exit(pid), 130);
    size_t n;
    char *e = read_all(err, &n);
    cr_expect(strstr(e, "stopped by SIGINT") && strstr(e, "repetitions that finished"), "%s", e);
    cJSON *j = cJSON_Parse(read_all(json, &n));
    cr_assert_not_null(j, "--json is not whole JSON");
    cr_expect(cJSON_IsTrue(cJSON_GetObjectItem(j, "interrupted")));
    double reps = cJSON_GetObjectItem(j, "repeat")->valuedouble;
    cr_expect(reps >= 1 && reps < 1000, "repeat %g", reps);
    cr_expect_eq(cJSON_GetArraySize(cJSON_GetObjectItem(j, "repetitions")), (int)reps);
    cJSON_Delete(j);
}

// ---- bad inputs, family by family ----------------------------------------------------------

// A copy of the tiny model in tmp/m with `file` replaced by data[0..n)
// (n == (size_t)-1: a directory of that name instead).
static void model_with(const char *file, const char *data, size_t n) {
    char cmd[1024], out[256], path[512];
    snprintf(cmd, sizeof cmd, "rm -rf %s/m && mkdir %s/m && cp %s/config.json %s/generation_config.json "
             "%s/model.safetensors %s/m/", tmp, tmp, TINY, TINY, TINY, tmp);
    cr_assert_eq(run_command(cmd, out, sizeof out), 0, "%s", out);
    if (!file) return;
    snprintf(path, sizeof path, "%s/m/%s", tmp, file);
    unlink(path);
    if (n == (size_t)-1) cr_assert_eq(mkdir(path, 0755), 0);
    else write_text(path, data, n);
}

// Every case: a clean message from minivllm on stderr, a non-zero exit
// status, never a signal (spawn/wait_exit assert that it exited).
Test(generate, bad_inputs_of_every_family_fail_cleanly) {
    static const struct {
        const char *family, *file, *data;
        size_t n;          // 0: strlen(data); (size_t)-1: a directory
        const char *args;  // after --model M
        int status;
        const char *error;
    } cases[] = {
        {"safetensors", "model.safetensors", "\x02\0\0\0\0\0\0\0{}", 10, "", 1, "model.embed_tokens.weight"},
        {"safetensors", "model.safetensors", "\xff\xff\xff\xff\xff\xff\xff\x7f{}", 10, "", 1, "header length"},
        {"safetensors", "model.safetensors", "", 0, "", 1, "too short"},
        {"safetensors", "model.safetensors", NULL, (size_t)-1, "", 1, "model.safetensors"},
        {"config", "config.json", "{\"vocab_size\": 1e400}", 0, "", 1, "config.json"},
        {"config", "config.json", "", 0, "", 1, "config.json"},
        {"config", "config.json", "[]", 0, "", 1, "not a JSON object"},
        {"config", "config.json", NULL, (size_t)-1, "", 1, "not a regular file"},
        {"config", "generation_config.json", "{\"top_p\": 2}", 0, "", 1, "top_p"},
        {"tokenizer", "tokenizer.json", NULL, (size_t)-1, "", 1, "tokenizer.json is not a regular file"},
        {"tokenizer", "tokenizer.json", "{\"model\": ", 0, "", 1, "malformed JSON"},
        {"tokenizer", "tokenizer.json", "\0\0\0\0", 4, "", 1, "tokenizer.json"},
        {"arguments", NULL, NULL, 0, "--max-tokens 0", 2, "--max-tokens"},
        {"arguments", NULL, NULL, 0, "--block-size 99999999", 2, "--block-size"},
        {"arguments", NULL, NULL, 0, "--temperature nan", 2, "--temperature"},
        {"arguments", NULL, NULL, 0, "--output", 2, "--output"},
        {"requests", NULL, NULL, 0, "--input /nonexistent.jsonl", 1, "cannot open /nonexistent.jsonl"},
    };
    char out[256], err[256], args[1024];
    path_in(out, sizeof out, "stdout.txt");
    path_in(err, sizeof err, "stderr.txt");
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        model_with(cases[k].file, cases[k].data, cases[k].n ? cases[k].n : cases[k].data ? strlen(cases[k].data) : 0);
        snprintf(args, sizeof args, "generate --model %s/m --input chapters/09-engine/demo.jsonl %s", tmp,
                 cases[k].args);
        int rc = wait_exit(spawn(args, out, err));
        size_t n;
        char *e = read_all(err, &n);
        cr_expect_eq(rc, cases[k].status, "%s case %zu (%s): exit %d: %s", cases[k].family, k, cases[k].error, rc, e);
        cr_expect(strncmp(e, "minivllm generate: ", 19) == 0 && strstr(e, cases[k].error), "%s case %zu: %s",
                  cases[k].family, k, e);
    }
}
