/*
 * tests/test_bench.c - `minivllm bench` and the random weights it can time.
 *
 * bench is a timing tool, so what is tested is everything but the times:
 * the workload is the one the header of cmd_bench.c promises (the token
 * counts equal the sums of the lengths drawn from --seed, replayed here with
 * common/rng.h), the table and the JSON say so, --random-weights runs from a
 * directory that holds nothing but config.json, and bad arguments exit 2
 * naming the argument. qwen3_weights_random is checked directly: it binds
 * like a checkpoint, norms are 1, matrices have HF's std, a seed replays.
 *
 * Run: make test (a second or two; under SANITIZE=1 too).
 */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "chapters/09-engine/qwen3_weights.h"
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
    static char buf[1 << 16];
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
    };
    char cmd[1024], out[4096];
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
