/*
 * tests/test_bench.c - `minivllm bench` and the random weights it can time.
 *
 * bench is a timing tool, so what is tested is everything but the times:
 * the workload is the one the header of cmd_bench.c promises (the token
 * counts equal the sums of the lengths drawn from --seed, replayed here with
 * common/rng.h, or of an --input file's lines), the table and the JSON say
 * so (every field, the repetitions, the latency mode's percentiles and their
 * sample counts), --random-weights runs from a directory that holds nothing
 * but config.json, bad arguments exit 2 naming the argument, and a bad input
 * line exits 1 naming its line and key. tests/bench/nanovllm_workload.py's
 * output is pinned by its sha256 (skipped without python3).
 * qwen3_weights_random is checked directly: it binds like a checkpoint, norms
 * are 1, matrices have HF's std, a seed replays.
 *
 * Run: make test (a few seconds; under SANITIZE=1 too).
 */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "chapters/09-engine/model/qwen3_weights.h"
#include "common/check.h"
#include "common/rng.h"
#include "tests/helpers.h"

#define TINY "tests/data/tiny-qwen3-tied"

// The token totals cmd_bench.c's header promises: request i's prompt and
// output lengths are draws 2i and 2i+1 of rng_int(min, max) from rng_seed(seed),
// each replaced by --prompt-len / --output-len when given (fixed_* > 0).
static void expected_tokens(uint64_t seed, int n, int lo, int hi, int fixed_prompt, int fixed_output,
                            long long *prompt, long long *output) {
    rng_t r;
    rng_seed(&r, seed);
    *prompt = *output = 0;
    for (int i = 0; i < n; i++) {
        int p = rng_int(&r, lo, hi), o = rng_int(&r, lo, hi);
        *prompt += fixed_prompt ? fixed_prompt : p;
        *output += fixed_output ? fixed_output : o;
    }
}

static cJSON *read_json(const char *path) {
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "cannot open %s", path);
    static char buf[1 << 20];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    fclose(f);
    cJSON *j = cJSON_Parse(buf);
    cr_assert_not_null(j, "%s is not JSON: %s", path, buf);
    return j;
}

static double num(const cJSON *j, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    cr_assert(cJSON_IsNumber(v), "JSON key %s missing or not a number", key);
    return v->valuedouble;
}

// Run bench on model_dir with `extra` (and --prompt-len / --output-len when fixed_* > 0)
// and check its table and JSON against the drawn lengths.
static void bench_and_check(const char *model_dir, const char *extra, uint64_t seed, int n, int lo, int hi,
                            int fixed_prompt, int fixed_output) {
    char json[] = "/tmp/mv_bench_XXXXXX";
    int fd = mkstemp(json);
    cr_assert(fd >= 0);
    close(fd);
    char cmd[2048], out[16384], fixed[64] = "";
    if (fixed_prompt) snprintf(fixed, sizeof fixed, "--prompt-len %d ", fixed_prompt);
    if (fixed_output) snprintf(fixed + strlen(fixed), sizeof fixed - strlen(fixed), "--output-len %d", fixed_output);
    snprintf(cmd, sizeof cmd,
             "./%s/minivllm bench --model %s --num-seqs %d --min-len %d --max-len %d --seed %llu --threads 2 "
             "--json %s %s %s 2>&1",
             MV_BUILD_DIR, model_dir, n, lo, hi, (unsigned long long)seed, json, fixed, extra);
    cr_assert_eq(run_command(cmd, out, sizeof out), 0, "%s\n%s", cmd, out);
    long long want_prompt, want_output;
    expected_tokens(seed, n, lo, hi, fixed_prompt, fixed_output, &want_prompt, &want_output);
    char line[128];
    snprintf(line, sizeof line, "prompt tokens    %lld\n", want_prompt);
    cr_expect(strstr(out, line) != NULL, "no '%s' in\n%s", line, out);
    snprintf(line, sizeof line, "output tokens    %lld\n", want_output);
    cr_expect(strstr(out, line) != NULL, "no '%s' in\n%s", line, out);
    cr_expect(strstr(out, "output tok/s") && strstr(out, "total tok/s") && strstr(out, "greedy (temperature 0)"),
              "%s", out);
    cJSON *j = read_json(json);
    cr_expect_eq(num(j, "requests"), n);
    cr_expect_eq(num(j, "prompt_tokens"), (double)want_prompt);
    cr_expect_eq(num(j, "output_tokens"), (double)want_output);
    cr_expect_eq(num(j, "threads"), 2);
    cr_expect(num(j, "generate_s") > 0 && num(j, "load_s") >= 0);
    // The fixed lengths, or null when drawn.
    const char *len_keys[2] = {"prompt_len", "output_len"};
    int fixed_lens[2] = {fixed_prompt, fixed_output};
    for (int k = 0; k < 2; k++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, len_keys[k]);
        if (fixed_lens[k]) cr_expect(cJSON_IsNumber(v) && v->valuedouble == fixed_lens[k], "%s", len_keys[k]);
        else cr_expect(cJSON_IsNull(v), "%s should be null when drawn", len_keys[k]);
    }
    double tot = (double)(want_prompt + want_output) / num(j, "generate_s");
    cr_expect(fabs(num(j, "total_tok_s") - tot) <= 1e-6 * tot, "total_tok_s %g, want %g", num(j, "total_tok_s"), tot);
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(j, "command");
    cr_expect(cJSON_IsString(c) && strstr(c->valuestring, "minivllm bench --model"), "command");
    cr_expect(cJSON_IsString(cJSON_GetObjectItemCaseSensitive(j, "date")));
    cr_expect(num(j, "host_cpus") >= 1);
    const cJSON *config = cJSON_GetObjectItemCaseSensitive(j, "config");
    cr_expect(cJSON_IsObject(config));
    cr_expect_gt(num(config, "n_params"), 0);
    // The default 3 repetitions, each the whole workload.
    const cJSON *reps = cJSON_GetObjectItemCaseSensitive(j, "repetitions");
    cr_expect_eq(cJSON_GetArraySize(reps), 3);
    for (const cJSON *r = reps ? reps->child : NULL; r; r = r->next)
        cr_expect(num(r, "output_tokens") == (double)want_output && num(r, "generate_s") > 0);
    cr_expect(num(j, "generate_s_min") <= num(j, "generate_s") && num(j, "generate_s") <= num(j, "generate_s_max"));
    cJSON_Delete(j);
    unlink(json);
}

Test(bench, counts_equal_the_drawn_lengths) {
    bench_and_check(TINY, "", 0, 6, 3, 17, 0, 0);
    bench_and_check(TINY, "", 7, 9, 1, 5, 0, 0);
    // Equal bounds: every request is exactly that long; a small token budget chunks the prefills.
    bench_and_check(TINY, "--max-num-batched-tokens 16", 3, 4, 20, 20, 0, 0);
}

// --prompt-len / --output-len replace their draws, alone or together; the
// single-stream shape (1 request, fixed prompt and output) among them.
Test(bench, fixed_lengths_replace_the_draws) {
    bench_and_check(TINY, "", 0, 1, 100, 1024 / 4, 64, 32);  // single stream
    bench_and_check(TINY, "", 2, 5, 3, 17, 9, 0);
    bench_and_check(TINY, "", 2, 5, 3, 17, 0, 11);
    // A fixed length may lie outside [min-len, max-len]: it is not drawn from there.
    bench_and_check(TINY, "", 4, 3, 10, 20, 200, 1);
}

Test(bench, random_weights_from_config_json_alone) {
    char dir[] = "/tmp/mv_bench_cfg_XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char cmd[1024], out[4096];
    snprintf(cmd, sizeof cmd, "cp tests/data/tiny-qwen3-untied/config.json %s/", dir);
    cr_assert_eq(system(cmd), 0);
    bench_and_check(dir, "--random-weights", 5, 4, 2, 9, 0, 0);
    // Without --random-weights the missing weights file is the error.
    snprintf(cmd, sizeof cmd, "./%s/minivllm bench --model %s --num-seqs 1 --min-len 1 --max-len 2 2>&1",
             MV_BUILD_DIR, dir);
    cr_expect_eq(run_command(cmd, out, sizeof out), 1, "%s", out);
    cr_expect(strstr(out, "model.safetensors") != NULL, "%s", out);
    snprintf(cmd, sizeof cmd, "rm -r %s", dir);
    cr_expect_eq(system(cmd), 0);
}

Test(bench, bad_arguments_exit_2_naming_them) {
    const char *bad[][2] = {
        {"--model " TINY " --num-seqs 0", "--num-seqs"},
        {"--model " TINY " --min-len 0", "--min-len"},
        {"--model " TINY " --max-len x", "--max-len"},
        {"--model " TINY " --min-len 10 --max-len 5", "--min-len 10 is greater than --max-len 5"},
        {"--model " TINY " --max-len 300", "--max-len 300"},  // 600 > max_model_len 512
        {"--model " TINY " --min-len 1 --max-len 60 --max-model-len 100", "--max-model-len"},
        {"--model " TINY " --seed -1", "--seed"},
        {"--model " TINY " --prompt-len 0", "--prompt-len"},
        {"--model " TINY " --output-len x", "--output-len"},
        // max_model_len 512: a fixed prompt plus the longest output (drawn or fixed) must fit.
        {"--model " TINY " --max-len 100 --prompt-len 450", "--prompt-len 450"},
        {"--model " TINY " --max-len 100 --output-len 450", "--max-len 100"},
        {"--model " TINY " --prompt-len 300 --output-len 300", "lower --prompt-len and --output-len"},
        {"--model " TINY " --device tpu", "tpu"},
        {"--model " TINY " --threads many", "--threads"},
        {"--model " TINY " --kv-cache-gib 0", "--kv-cache-gib"},
        {"--model " TINY " --json", "--json"},
        {"--model " TINY " --bogus", "--bogus"},
        {"--num-seqs 4", "--model"},
        {"--model " TINY " --repeat 0", "--repeat"},
        {"--model " TINY " --sampling hot", "--sampling 'hot'"},
        {"--model " TINY " --sampling file", "--sampling file"},  // only --input has lines
        {"--model " TINY " --temperature -1", "--temperature"},
        {"--model " TINY " --top-p 0", "--top-p"},
        {"--model " TINY " --top-k x", "--top-k"},
        {"--model " TINY " --input x.jsonl --num-seqs 4", "--num-seqs: the requests come from --input"},
        {"--model " TINY " --input x.jsonl --output-len 4", "--output-len"},
        {"--model " TINY " --input x.jsonl --latency", "choose one"},
        {"--model " TINY " --batch 1,8", "--batch goes with --latency"},
        {"--model " TINY " --latency --batch 0", "--batch '0'"},
        {"--model " TINY " --latency --batch 1,,8", "--batch '1,,8'"},
        {"--model " TINY " --latency --batch 1,x", "--batch"},
        {"--model " TINY " --latency --min-len 4", "--min-len"},
        {"--model " TINY " --latency --num-seqs 4", "--num-seqs"},
        // 512 + 256 does not fit the tiny model's 512 positions: the defaults named.
        {"--model " TINY " --latency", "--prompt-len 512"},
        {"--model " TINY " --latency --batch 32 --max-num-seqs 8 --prompt-len 8 --output-len 8", "--max-num-seqs 8"},
    };
    char cmd[1024], out[16384];
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        snprintf(cmd, sizeof cmd, "./%s/minivllm bench %s 2>&1", MV_BUILD_DIR, bad[k][0]);
        cr_expect_eq(run_command(cmd, out, sizeof out), 2, "%s: %s", bad[k][0], out);
        cr_expect(strstr(out, bad[k][1]) != NULL, "%s: %s", bad[k][0], out);
    }
    snprintf(cmd, sizeof cmd, "./%s/minivllm bench --model %s --device cuda 2>&1", MV_BUILD_DIR, TINY);
    cr_expect_eq(run_command(cmd, out, sizeof out), 1, "%s", out);
    // No GPU is visible to run_command's commands: a clear error, not a crash.
    cr_expect(strstr(out, "--device cuda") && strstr(out, "use --device cpu"), "%s", out);
    snprintf(cmd, sizeof cmd, "./%s/minivllm bench --model /nonexistent --num-seqs 1 2>&1", MV_BUILD_DIR);
    cr_expect_eq(run_command(cmd, out, sizeof out), 1, "%s", out);
    snprintf(cmd, sizeof cmd, "./%s/minivllm bench --help 2>&1", MV_BUILD_DIR);
    cr_expect_eq(run_command(cmd, out, sizeof out), 0, "%s", out);
    cr_expect(strstr(out, "usage: minivllm bench") && strstr(out, "--random-weights") && strstr(out, "ignore_eos"),
              "%s", out);
}

// Every tensor of qwen3_weights_random, bound as a checkpoint is.
Test(bench, random_weights_bind_and_replay) {
    qwen3_config_t c;
    cr_assert_eq(qwen3_config_load("tests/data/tiny-qwen3-untied", &c), 0, "%s", mv_last_error());
    st_model_t *a, *b, *other;
    cr_assert_eq(qwen3_weights_random(&c, 11, 0.02f, &a), 0, "%s", mv_last_error());
    cr_assert_eq(qwen3_weights_random(&c, 11, 0.02f, &b), 0);
    cr_assert_eq(qwen3_weights_random(&c, 12, 0.02f, &other), 0);
    qwen3_weights_t w;
    cr_assert_eq(qwen3_weights_bind(&c, a, &w), 0, "%s", mv_last_error());
    cr_expect_eq(w.n_params, qwen3_config_n_params(&c));
    cr_assert_eq(a->n_tensors, b->n_tensors);
    for (size_t i = 0; i < a->n_tensors; i++) {
        cr_expect_str_eq(a->tensors[i].name, b->tensors[i].name);
        cr_expect(memcmp(a->tensors[i].data, b->tensors[i].data, a->tensors[i].nbytes) == 0, "%s differs for one seed",
                  a->tensors[i].name);
    }
    const st_tensor_t *e = st_find(a, "model.embed_tokens.weight"), *e2 = st_find(other, "model.embed_tokens.weight");
    cr_expect(memcmp(e->data, e2->data, e->nbytes) != 0, "seeds 11 and 12 gave the same embeddings");
    // A matrix: mean ~0, std ~0.02 (V*H = 32768 draws: the std's own error is ~0.4%).
    const bf16_t *x = e->data;
    double s = 0, s2 = 0;
    size_t n = (size_t)st_numel(e);
    for (size_t i = 0; i < n; i++) {
        double v = bf16_to_float(x[i]);
        s += v;
        s2 += v * v;
    }
    double mean = s / (double)n, sd = sqrt(s2 / (double)n - mean * mean);
    cr_expect(fabs(mean) < 1e-3 && fabs(sd - 0.02) < 1e-3, "mean %g std %g", mean, sd);
    // Norm weights are RMSNorm's identity, 1.
    const bf16_t *g = w.layers[1].k_norm->data;
    for (int i = 0; i < c.head_dim; i++) cr_expect_eq(bf16_to_float(g[i]), 1.0f);
    qwen3_weights_free(&w);
    st_close(a);
    st_close(b);
    st_close(other);
}

// ---- --input -----------------------------------------------------------------------------

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f, "cannot write %s", path);
    fputs(text, f);
    fclose(f);
}

static const char *str(const cJSON *j, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    cr_assert(cJSON_IsString(v), "JSON key %s missing or not a string", key);
    return v->valuestring;
}

// Run `minivllm bench --model TINY ARGS --json TMP`; exit 0 expected; the parsed JSON.
static cJSON *bench_json(const char *args, char *out, size_t cap) {
    char json[] = "/tmp/mv_bench_json_XXXXXX";
    int fd = mkstemp(json);
    cr_assert(fd >= 0);
    close(fd);
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "./%s/minivllm bench --model %s --threads 2 --json %s %s 2>&1", MV_BUILD_DIR, TINY, json,
             args);
    cr_assert_eq(run_command(cmd, out, cap), 0, "%s\n%s", cmd, out);
    cJSON *j = read_json(json);
    unlink(json);
    return j;
}

// Five requests: prompts of 3, 5, 1, 7, 2 ids (17), outputs of 4, 1, 6, 3, 2 (16); a blank line is skipped.
static const char INPUT5[] =
    "{\"prompt_token_ids\": [5, 6, 7], \"max_tokens\": 4}\n"
    "{\"prompt_token_ids\": [9, 10, 11, 12, 13], \"max_tokens\": 1, \"temperature\": 0.8, \"seed\": 3}\n"
    "\n"
    "{\"prompt_token_ids\": [100], \"max_tokens\": 6, \"top_k\": 5, \"top_p\": 0.5, \"temperature\": 1}\n"
    "{\"prompt_token_ids\": [1, 2, 3, 4, 5, 6, 7], \"max_tokens\": 3, \"ignore_eos\": true}\n"
    "{\"prompt_token_ids\": [400, 401], \"max_tokens\": 2, \"ignore_eos\": true}\n";

Test(bench, input_file_is_the_workload) {
    char in[] = "/tmp/mv_bench_in_XXXXXX", out[16384];
    int fd = mkstemp(in);
    cr_assert(fd >= 0);
    close(fd);
    write_file(in, INPUT5);
    char args[256];
    snprintf(args, sizeof args, "--input %s --repeat 2", in);
    cJSON *j = bench_json(args, out, sizeof out);
    cr_expect_str_eq(str(j, "mode"), "throughput");
    cr_expect_str_eq(str(j, "workload"), "input");
    cr_expect_str_eq(str(j, "input"), in);
    cr_expect_eq(num(j, "requests"), 5);
    cr_expect_eq(num(j, "prompt_tokens"), 18);
    // Lines without "ignore_eos" ignore eos in bench, so every request makes exactly its max_tokens.
    cr_expect_eq(num(j, "output_tokens"), 16);
    cr_expect_eq(num(j, "repeat"), 2);
    cr_expect_eq(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(j, "repetitions")), 2);
    // Each line keeps its own sampling (--sampling file, the default with --input): not one temperature.
    cr_expect_str_eq(str(j, "sampling"), "file");
    cr_expect(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(j, "temperature")));
    cr_expect(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "ignore_eos")));
    cr_expect(strstr(out, "sampling per line") && strstr(out, "prompt tokens    18\n") &&
                  strstr(out, "output tokens    16\n"),
              "%s", out);
    // TTFT for every request of both repetitions; TPOT for the 4 with >= 2 tokens.
    const cJSON *ttft = cJSON_GetObjectItemCaseSensitive(j, "ttft_ms"), *tpot = cJSON_GetObjectItemCaseSensitive(j, "tpot_ms");
    cr_expect_eq(num(ttft, "samples"), 10);
    cr_expect_eq(num(tpot, "samples"), 8);
    cr_expect(num(ttft, "min") > 0 && num(ttft, "p50") <= num(ttft, "p99") && num(ttft, "p99") <= num(ttft, "max"));
    cr_expect(num(ttft, "max") <= 1e3 * num(j, "generate_s_max"), "a first token after the run ended");
    cJSON_Delete(j);
    // "-" reads standard input.
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "./%s/minivllm bench --model %s --threads 2 --repeat 1 --input - < %s 2>&1", MV_BUILD_DIR,
             TINY, in);
    cr_expect_eq(run_command(cmd, out, sizeof out), 0, "%s", out);
    cr_expect(strstr(out, "prompt tokens    18\n") != NULL, "%s", out);
    unlink(in);
}

// --sampling and the single overrides replace every line's sampling.
Test(bench, sampling_overrides_every_line) {
    char in[] = "/tmp/mv_bench_in_XXXXXX", out[16384], args[512];
    int fd = mkstemp(in);
    cr_assert(fd >= 0);
    close(fd);
    write_file(in, INPUT5);
    struct {
        const char *opts;
        double temperature, top_k, top_p;
        const char *table;
    } cases[] = {
        {"--sampling greedy", 0, 0, 1, "greedy (temperature 0)"},
        // tiny-qwen3-tied's generation_config.json has Qwen3's values.
        {"--sampling qwen3", 0.6, 20, 0.95, "temperature 0.6, top_k 20, top_p 0.95"},
        {"--sampling greedy --temperature 0.7 --top-k 3", 0.7, 3, 1, "temperature 0.7, top_k 3, top_p 1"},
        {"--sampling qwen3 --top-p 0.5", 0.6, 20, 0.5, "top_p 0.5"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        snprintf(args, sizeof args, "--input %s --repeat 1 %s", in, cases[k].opts);
        cJSON *j = bench_json(args, out, sizeof out);
        cr_expect(fabs(num(j, "temperature") - cases[k].temperature) < 1e-6, "%s: temperature", cases[k].opts);
        cr_expect_eq(num(j, "top_k"), cases[k].top_k, "%s: top_k", cases[k].opts);
        cr_expect(fabs(num(j, "top_p") - cases[k].top_p) < 1e-6, "%s: top_p", cases[k].opts);
        cr_expect(strstr(out, cases[k].table) != NULL, "%s: no '%s' in\n%s", cases[k].opts, cases[k].table, out);
        cr_expect_eq(num(j, "output_tokens"), 16, "%s", cases[k].opts);
        cJSON_Delete(j);
    }
    unlink(in);
}

// A bad line stops bench before anything loads: exit 1, the file, the line and the key named.
Test(bench, bad_input_lines_are_named) {
    char in[] = "/tmp/mv_bench_bad_XXXXXX", cmd[1024], out[8192];
    int fd = mkstemp(in);
    cr_assert(fd >= 0);
    close(fd);
    const char *bad[][2] = {
        {"{\"max_tokens\": 3}", "prompt_token_ids"},                             // no prompt
        {"{\"prompt_token_ids\": [1, 2]}", "\"max_tokens\" is missing"},          // bench needs the length
        {"{\"prompt_token_ids\": [1, 2], \"max_tokens\": 0}", "\"max_tokens\" must be an integer >= 1"},
        {"{\"prompt_token_ids\": [1, 2], \"max_tokens\": \"8\"}", "max_tokens"},
        {"{\"prompt_token_ids\": [1, 2], \"max_tokens\": 2.5}", "max_tokens"},
        {"{\"prompt_token_ids\": [1, 512], \"max_tokens\": 2}", "\"prompt_token_ids\"[1] = 512 is outside the vocabulary [0, 512)"},
        {"{\"prompt_token_ids\": [-1], \"max_tokens\": 2}", "vocabulary"},
        {"{\"prompt_token_ids\": [], \"max_tokens\": 2}", "empty"},
        {"{\"prompt_token_ids\": [1, 2], \"max_tokens\": 2, \"top_p\": 0}", "top_p"},
        {"{\"prompt_token_ids\": [1, 2], \"max_tokens\": 2, \"max_tokns\": 2}", "max_tokns"},
        {"{\"prompt\": \"Hello\", \"max_tokens\": 2}", "bench times token ids"},
        {"{\"prompt_token_ids\": [1, 2], \"max_tokens\": 511}", "max_model_len"},  // 2 + 511 > 512
        {"{\"prompt_token_ids\": [1, 2", "JSON"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        char text[512];
        snprintf(text, sizeof text, "{\"prompt_token_ids\": [7, 8], \"max_tokens\": 2}\n%s\n", bad[k][0]);
        write_file(in, text);
        snprintf(cmd, sizeof cmd, "./%s/minivllm bench --model %s --input %s 2>&1", MV_BUILD_DIR, TINY, in);
        cr_expect_eq(run_command(cmd, out, sizeof out), 1, "%s: %s", bad[k][0], out);
        char where[160];
        snprintf(where, sizeof where, "%s:2: ", in);
        cr_expect(strstr(out, where) && strstr(out, bad[k][1]), "%s: want '%s%s' in: %s", bad[k][0], where, bad[k][1],
                  out);
        cr_expect(strstr(out, "output tok/s") == NULL, "%s: a table after a bad line: %s", bad[k][0], out);
    }
    const char *empty[] = {"", "\n  \n"};
    for (size_t k = 0; k < 2; k++) {
        write_file(in, empty[k]);
        snprintf(cmd, sizeof cmd, "./%s/minivllm bench --model %s --input %s 2>&1", MV_BUILD_DIR, TINY, in);
        cr_expect_eq(run_command(cmd, out, sizeof out), 1, "%s", out);
        cr_expect(strstr(out, "no requests") != NULL, "%s", out);
    }
    snprintf(cmd, sizeof cmd, "./%s/minivllm bench --model %s --input /nonexistent.jsonl 2>&1", MV_BUILD_DIR, TINY);
    cr_expect_eq(run_command(cmd, out, sizeof out), 1, "%s", out);
    cr_expect(strstr(out, "/nonexistent.jsonl") != NULL, "%s", out);
    unlink(in);
}

// ---- --latency ---------------------------------------------------------------------------

// Each batch size runs whole (max_num_seqs raised from the CPU's 16 to 20), every request of
// every repetition gives one TTFT and one TPOT, and the percentiles are ordered.
Test(bench, latency_mode_times_each_batch) {
    char out[16384];
    cJSON *j = bench_json("--latency --batch 1,3,20 --prompt-len 16 --output-len 8 --repeat 2", out, sizeof out);
    cr_expect_str_eq(str(j, "mode"), "latency");
    cr_expect_eq(num(j, "prompt_len"), 16);
    cr_expect_eq(num(j, "output_len"), 8);
    cr_expect_eq(num(j, "temperature"), 0);
    cr_expect_geq(num(cJSON_GetObjectItemCaseSensitive(j, "config"), "max_num_seqs"), 20);
    const cJSON *batches = cJSON_GetObjectItemCaseSensitive(j, "batches");
    cr_assert_eq(cJSON_GetArraySize(batches), 3);
    const int want[3] = {1, 3, 20};
    int k = 0;
    for (const cJSON *b = batches->child; b; b = b->next, k++) {
        cr_expect_eq(num(b, "batch"), want[k]);
        const cJSON *ttft = cJSON_GetObjectItemCaseSensitive(b, "ttft_ms");
        const cJSON *tpot = cJSON_GetObjectItemCaseSensitive(b, "tpot_ms");
        cr_expect_eq(num(ttft, "samples"), 2 * want[k]);
        cr_expect_eq(num(tpot, "samples"), 2 * want[k]);
        cr_expect_eq(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(b, "ttft_ms_all")), 2 * want[k]);
        cr_expect_eq(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(b, "tpot_ms_all")), 2 * want[k]);
        for (int q = 0; q < 2; q++) {
            const cJSON *p = q ? tpot : ttft;
            cr_expect(num(p, "min") > 0 && num(p, "min") <= num(p, "p50") && num(p, "p50") <= num(p, "p99") &&
                          num(p, "p99") <= num(p, "max"),
                      "batch %d: %s not ordered", want[k], q ? "tpot" : "ttft");
        }
        const cJSON *reps = cJSON_GetObjectItemCaseSensitive(b, "repetitions");
        cr_expect_eq(cJSON_GetArraySize(reps), 2);
        const cJSON *ttft_all = cJSON_GetObjectItemCaseSensitive(b, "ttft_ms_all");
        const cJSON *tpot_all = cJSON_GetObjectItemCaseSensitive(b, "tpot_ms_all");
        int r_i = 0;
        for (const cJSON *r = reps->child; r; r = r->next, r_i++) {
            cr_expect_eq(num(r, "output_tokens"), 8 * want[k]);
            cr_expect_eq(num(r, "prompt_tokens"), 16 * want[k]);
            cr_expect_eq(num(r, "preemptions"), 0);
            // Every request's first token, then its 7 others, within its run (samples are
            // request after request, repetition after repetition).
            for (int i = 0; i < want[k]; i++) {
                double first = cJSON_GetArrayItem(ttft_all, r_i * want[k] + i)->valuedouble;
                double per = cJSON_GetArrayItem(tpot_all, r_i * want[k] + i)->valuedouble;
                cr_expect(first > 0 && per > 0 && first + 7 * per <= 1e3 * num(r, "generate_s") + 1e-6,
                          "batch %d, run %d, request %d: first token %g ms + 7 x %g ms after the run's %g ms", want[k],
                          r_i, i, first, per, 1e3 * num(r, "generate_s"));
            }
        }
        const cJSON *os = cJSON_GetObjectItemCaseSensitive(b, "output_tok_s");
        cr_expect(num(os, "min") <= num(os, "median") && num(os, "median") <= num(os, "max"));
    }
    cr_expect(strstr(out, "TTFT p50 ms") && strstr(out, "TPOT p99 ms"), "%s", out);
    cJSON_Delete(j);
    // A cache too small to hold a batch whole is refused (it would queue or preempt): 20 x 2 blocks > 30.
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "./%s/minivllm bench --model %s --latency --batch 2,20 --prompt-len 16 --output-len 8 --num-blocks 30 2>&1",
             MV_BUILD_DIR, TINY);
    cr_expect_eq(run_command(cmd, out, sizeof out), 1, "%s", out);
    cr_expect(strstr(out, "--batch 20") && strstr(out, "KV blocks") && strstr(out, "--num-blocks"), "%s", out);
}

// ---- --json ------------------------------------------------------------------------------

Test(bench, json_names_commit_machine_and_times) {
    char out[16384];
    setenv("MV_COMMIT", "abc1234", 1);
    cJSON *j = bench_json("--num-seqs 3 --min-len 2 --max-len 6 --repeat 1 --no-warmup", out, sizeof out);
    unsetenv("MV_COMMIT");
    cr_expect_str_eq(str(j, "commit"), "abc1234");
    cr_expect(strstr(str(j, "command"), "minivllm bench --model " TINY) != NULL);
    cr_expect_eq(strlen(str(j, "date")), 20);  // 2026-01-02T03:04:05Z
    cr_expect_str_eq(str(j, "device"), "cpu");
    cr_expect(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(j, "gpu")), "no GPU is named on --device cpu");
    cr_expect(cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(j, "warmup")));
    cr_expect_eq(num(j, "warmup_s"), 0);
    cr_expect(num(j, "wall_s") >= num(j, "load_s") + num(j, "generate_s"), "wall_s holds the load and the run");
    const char *keys[] = {"requests", "prompt_tokens", "output_tokens", "output_tok_s", "total_tok_s", "steps",
                          "preemptions", "weight_bytes", "kv_cache_bytes", "scratch_bytes", "host_cpus", "seed"};
    for (size_t k = 0; k < sizeof keys / sizeof *keys; k++) num(j, keys[k]);
    cr_expect(cJSON_IsString(cJSON_GetObjectItemCaseSensitive(j, "host_cpu")));
    cr_expect(cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(j, "config")));
    cJSON_Delete(j);
    // Without MV_COMMIT: git's hash here (the tests run in the repository), or "unknown" without git.
    j = bench_json("--num-seqs 1 --min-len 2 --max-len 3 --repeat 1", out, sizeof out);
    cr_expect(strlen(str(j, "commit")) >= 4, "commit '%s'", str(j, "commit"));
    cJSON_Delete(j);
}

// --step-trace: a header, then one line per step of every timed run, numbered; the query tokens
// sum to the prompts plus every generated token but each request's last (it is sampled, never
// run), the sampled rows to the outputs, and a run's steps are the JSON's.
Test(bench, step_trace_has_every_timed_step) {
    char tr[] = "/tmp/mv_bench_trace_XXXXXX", out[16384], args[256];
    int fd = mkstemp(tr);
    cr_assert(fd >= 0);
    close(fd);
    snprintf(args, sizeof args, "--num-seqs 3 --prompt-len 5 --output-len 4 --repeat 2 --step-trace %s", tr);
    cJSON *j = bench_json(args, out, sizeof out);
    FILE *f = fopen(tr, "r");
    cr_assert_not_null(f);
    char line[512];
    cr_assert_not_null(fgets(line, sizeof line, f));
    cr_expect_str_eq(line, "rep,step,rows,prefill_rows,tokens,context_tokens,sampled,runner_us,host_us\n");
    long tokens[3] = {0}, sampled[3] = {0}, steps[3] = {0};
    int rep, step, rows, prefill, tok, smp, last_step = -1, last_rep = 1;
    long long ctx;
    double runner_us, host_us;
    while (fgets(line, sizeof line, f)) {
        cr_assert_eq(sscanf(line, "%d,%d,%d,%d,%d,%lld,%d,%lf,%lf", &rep, &step, &rows, &prefill, &tok, &ctx, &smp,
                            &runner_us, &host_us),
                     9, "bad trace line: %s", line);
        cr_assert(rep == 1 || rep == 2, "rep %d", rep);
        if (rep != last_rep) last_step = -1, last_rep = rep;
        cr_expect_eq(step, last_step + 1, "steps are numbered in order: %s", line);
        last_step = step;
        cr_expect(rows >= 1 && rows <= 3 && prefill <= rows && tok >= rows && ctx >= tok && smp <= rows, "%s", line);
        cr_expect(runner_us > 0 && host_us >= 0, "%s", line);
        tokens[rep] += tok, sampled[rep] += smp, steps[rep]++;
    }
    fclose(f);
    unlink(tr);
    for (int r = 1; r <= 2; r++) {
        cr_expect_eq(tokens[r], 3 * 5 + 3 * 3, "run %d: query tokens", r);
        cr_expect_eq(sampled[r], 3 * 4, "run %d: sampled rows", r);
        cr_expect_eq(steps[r], (long)num(j, "steps"), "run %d: steps", r);
    }
    cJSON_Delete(j);
    // A path that cannot be written fails at once, naming it.
    char cmd[512];
    snprintf(cmd, sizeof cmd,
             "./%s/minivllm bench --model %s --num-seqs 1 --min-len 2 --max-len 3 --step-trace /nonexistent-dir/t.csv "
             "2>&1",
             MV_BUILD_DIR, TINY);
    cr_expect_eq(run_command(cmd, out, sizeof out), 1, "%s", out);
    cr_expect(strstr(out, "--step-trace /nonexistent-dir/t.csv") != NULL, "%s", out);
}

// The --json path is opened before the model loads: on Qwen3-0.6B's shapes, drawing random
// weights would take seconds, so an answer within one proves the order.
Test(bench, bad_json_path_fails_before_loading) {
    char cmd[1024], out[4096];
    snprintf(cmd, sizeof cmd,
             "timeout 60 ./%s/minivllm bench --model tests/data/qwen3-0.6b-shape --random-weights --device cpu "
             "--json /nonexistent-dir/bench.json 2>&1",
             MV_BUILD_DIR);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    cr_expect_eq(run_command(cmd, out, sizeof out), 1, "%s", out);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    cr_expect(strstr(out, "--json: cannot open /nonexistent-dir/bench.json") != NULL, "%s", out);
    cr_expect_lt(s, 1.0, "the bad --json path took %.2f s to report: it was opened after loading", s);
}

// ---- tests/bench/nanovllm_workload.py ----------------------------------------------------

// The script's default output, bench.py's workload: 256 requests, 142,827 prompt ids, 133,966
// output tokens; the first prompt 964 ids [6311, 6890, 663, ...], max_tokens 845, 724, 484, ...
#define NANOVLLM_SHA256 "83225fdd3571c30c87dba8d80e8b3ae0c9810672d30adfcd686b93070fbb49d6"
#define NANOVLLM_GREEDY_SHA256 "354b94b3d7f34ec4157ff10fb1b64a2707778a5c19f7c61086b642747e8a9c16"

static void python3_or_skip(void) {
    char out[256];
    if (run_command("command -v python3 >/dev/null 2>&1 && echo yes", out, sizeof out) != 0 || !strstr(out, "yes")) {
        fprintf(stderr, "SKIP: no python3, so tests/bench/nanovllm_workload.py is not checked\n");
        cr_skip_test("no python3");
    }
}

Test(bench, nanovllm_workload_is_pinned) {
    python3_or_skip();
    const char *args[2] = {"", "--greedy"}, *want[2] = {NANOVLLM_SHA256, NANOVLLM_GREEDY_SHA256};
    char cmd[512], out[256];
    for (int k = 0; k < 2; k++) {
        snprintf(cmd, sizeof cmd,
                 "python3 tests/bench/nanovllm_workload.py %s | python3 -c 'import hashlib, sys; "
                 "print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())'",
                 args[k]);
        cr_assert_eq(run_command(cmd, out, sizeof out), 0, "%s", out);
        cr_expect(strncmp(out, want[k], 64) == 0,
                  "tests/bench/nanovllm_workload.py %s writes another workload (sha256 %.64s, want %s): it must draw "
                  "exactly as nano-vllm's bench.py does (its docstring); if bench.py itself changed, rerun the script "
                  "and update the sha256 here",
                  args[k], out, want[k]);
    }
}

// The script's small form (a tiny vocabulary and context, same order of draws) through bench --input.
Test(bench, nanovllm_workload_runs_through_bench_input) {
    python3_or_skip();
    char in[] = "/tmp/mv_bench_nv_XXXXXX", cmd[1024], out[16384], args[256];
    int fd = mkstemp(in);
    cr_assert(fd >= 0);
    close(fd);
    snprintf(cmd, sizeof cmd,
             "python3 tests/bench/nanovllm_workload.py --num-seqs 5 --min-len 3 --max-input-len 20 "
             "--max-output-len 12 --max-id 500 --out %s 2>&1",
             in);
    cr_assert_eq(run_command(cmd, out, sizeof out), 0, "%s", out);
    snprintf(args, sizeof args, "--input %s --repeat 1", in);
    cJSON *j = bench_json(args, out, sizeof out);
    // Prompts of 15, 14, 20, 9, 20 ids; outputs of 4, 6, 12, 6, 6 tokens: seed(0)'s draws in bench.py's order.
    cr_expect_eq(num(j, "prompt_tokens"), 78);
    cr_expect_eq(num(j, "output_tokens"), 34);
    cr_expect(fabs(num(j, "temperature") - 0.6) < 1e-6, "bench.py's temperature 0.6 on every line");
    cr_expect_eq(num(j, "top_k"), 0);
    cJSON_Delete(j);
    unlink(in);
}
