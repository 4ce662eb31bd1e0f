/*
 * tests/test_fuzz.c - in-process fuzzing of every parser that reads a file
 * or a line from outside: the safetensors header and layout, config.json,
 * tokenizer.json (loading) and the tokenizer's encoder, the JSONL request
 * lines of `generate` / `bench`, and the server's request bodies.
 *
 * Each target takes bytes and must never crash, hang or break an invariant:
 *   safetensors  st_open_file: refused with a message, or every tensor's
 *                bytes inside the file, nbytes = numel x dtype size, names
 *                sorted and distinct; then binding against a config either
 *                way, cleanly.
 *   config       qwen3_config_load: refused, or the shapes it promises
 *                (heads divide, head_dim even, sizes >= 1).
 *   tokenizer    tokenizer_load on mutated tokenizer.json: refused or loaded.
 *   encode       for valid UTF-8: ids in [0, n_ids), decode(encode(x)) ==
 *                x with each piece between added tokens NFC-normalised (as
 *                Hugging Face does), the streaming decoder == the batch
 *                decoder; invalid UTF-8 refused.
 *   requests     cli_requests_add_line: refused, or ids in the vocabulary and
 *                sampling values the sampler accepts; a line holding a NUL is
 *                never accepted.
 *   api          the server's bodies, api_parse_request (serve/openai.c) for
 *                /v1/completions or /v1/chat/completions: refused with an
 *                HTTP status and a message, or prompts inside the vocabulary
 *                and the context and sampling values the sampler accepts.
 *
 * Two drivers, one set of targets:
 *   - `make test` (CI, gcc, no clang needed): a deterministic mutation fuzzer
 *     in this file, started from the seeds below (the committed corpus), a
 *     bounded number of runs per target (MV_FUZZ_RUNS, default 4000) and
 *     seconds (MV_FUZZ_SECONDS, default 6); each test prints its exec count.
 *     Under SANITIZE=1 it runs with ASan and UBSan. A longer local run is one
 *     command:  MV_FUZZ_RUNS=1000000 MV_FUZZ_SECONDS=600 build/tests/test_fuzz
 *     (MV_FUZZ_SEED=N draws another sequence).
 *   - libFuzzer, with clang (coverage-guided): `make fuzz` builds the six
 *     targets with ASan and UBSan and runs each for FUZZ_SECONDS (default
 *     60) from the committed corpus tests/fuzz/corpus/TARGET/ (the seeds
 *     below, written out by MV_FUZZ_WRITE_SEEDS=DIR); CI runs it. By hand,
 *     one target a binary, e.g.
 *       clang -O1 -g -fsanitize=fuzzer,address,undefined -std=c11 -D_GNU_SOURCE -I. \
 *         -DMV_LIBFUZZER -DMV_FUZZ_TARGET=fuzz_safetensors tests/test_fuzz.c \
 *         $(find chapters/09-engine/model chapters/09-engine/text chapters/09-engine/runtime \
 *                chapters/08-scheduler/sched chapters/03-linear-tp common reference -name '*.c' -not -name main.c) \
 *         -lcjson -lpcre2-8 -lutf8proc -lxxhash -lm -lpthread -o /tmp/fuzz_st && /tmp/fuzz_st -max_total_time=600
 *     (MV_FUZZ_TARGET: fuzz_safetensors, fuzz_config, fuzz_tokenizer_load,
 *     fuzz_encode, fuzz_requests, fuzz_api).
 *
 * The request target compiles cli/cli.c and cli/requests.c into this test
 * (they belong to the minivllm program, not to a library archive).
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <utf8proc.h>

#include "chapters/09-engine/cli/cli.c"
#include "chapters/09-engine/cli/requests.c"
#include "chapters/09-engine/model/model_config.h"
#include "chapters/09-engine/model/qwen3_weights.h"
#include "chapters/09-engine/model/safetensors.h"
#include "chapters/09-engine/runtime/sampler.h"
#include "chapters/09-engine/serve/openai.h"
#include "chapters/09-engine/text/tokenizer.h"
#include "common/check.h"

#ifdef MV_LIBFUZZER
#define CHECK(cond, ...)                                  \
    do {                                                  \
        if (!(cond)) {                                    \
            fprintf(stderr, "invariant broken: " __VA_ARGS__); \
            abort();                                      \
        }                                                 \
    } while (0)
#else
#define CHECK(cond, ...) cr_assert(cond, __VA_ARGS__)
#endif

// ---- a scratch directory for the targets that read files ----------------------------------

static char fuzz_dir[64];

static void fuzz_dir_init(void) {
    if (fuzz_dir[0]) return;
    snprintf(fuzz_dir, sizeof fuzz_dir, "%s/mv_fuzz_XXXXXX", access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
    if (!mkdtemp(fuzz_dir)) abort();
}

static void put_file(const char *name, const uint8_t *data, size_t n) {
    char path[128];
    snprintf(path, sizeof path, "%s/%s", fuzz_dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || (n && fwrite(data, 1, n, f) != n)) abort();
    fclose(f);
}

// ---- the targets -------------------------------------------------------------------------------

static long fuzz_accepted;  // inputs a target's parser accepted (the rest were refused, cleanly)

static const char CONFIG_SEED[] =
    "{\"architectures\": [\"Qwen3ForCausalLM\"], \"model_type\": \"qwen3\", \"vocab_size\": 16, "
    "\"hidden_size\": 8, \"intermediate_size\": 12, \"num_hidden_layers\": 1, \"num_attention_heads\": 2, "
    "\"num_key_value_heads\": 1, \"head_dim\": 4, \"rms_norm_eps\": 1e-06, \"rope_theta\": 1000000, "
    "\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8, \"low_freq_factor\": 1, \"high_freq_factor\": 4, "
    "\"original_max_position_embeddings\": 32}, \"max_position_embeddings\": 64, \"tie_word_embeddings\": true, "
    "\"attention_bias\": false, \"torch_dtype\": \"bfloat16\", \"bos_token_id\": 1, \"eos_token_id\": [2, 3]}";

int fuzz_safetensors(const uint8_t *data, size_t n) {
    fuzz_dir_init();
    put_file("model.safetensors", data, n);
    char path[128];
    snprintf(path, sizeof path, "%s/model.safetensors", fuzz_dir);
    st_model_t *m = NULL;
    if (st_open_file(path, &m)) {
        CHECK(m == NULL && mv_last_error()[0], "a refusal without a message or with a model");
        return 0;
    }
    fuzz_accepted++;
    const uint8_t *lo = m->files[0].data, *hi = lo + m->files[0].size;
    for (size_t i = 0; i < m->n_tensors; i++) {
        const st_tensor_t *t = &m->tensors[i];
        CHECK(t->nbytes == (size_t)st_numel(t) * st_dtype_size(t->dtype), "tensor %s: nbytes", t->name);
        CHECK(t->nbytes == 0 || ((const uint8_t *)t->data >= lo + 8 && (const uint8_t *)t->data + t->nbytes <= hi),
              "tensor %s lies outside its file", t->name);
        CHECK(i == 0 || strcmp(m->tensors[i - 1].name, t->name) < 0, "names not sorted and distinct at %s", t->name);
        CHECK(st_find(m, t->name) == t, "st_find(%s)", t->name);
    }
    // Binding is the next parser the bytes meet: against the tiny config, it must fail or succeed cleanly.
    qwen3_config_t c = {0};
    c.vocab_size = 16, c.hidden_size = 8, c.intermediate_size = 12, c.num_hidden_layers = 1;
    c.num_attention_heads = 2, c.num_key_value_heads = 1, c.head_dim = 4, c.tie_word_embeddings = 1;
    qwen3_weights_t w;
    if (qwen3_weights_bind(&c, m, &w) == 0) qwen3_weights_free(&w);
    st_close(m);
    return 0;
}

int fuzz_config(const uint8_t *data, size_t n) {
    fuzz_dir_init();
    put_file("config.json", data, n);
    qwen3_config_t c;
    if (qwen3_config_load(fuzz_dir, &c)) {
        CHECK(mv_last_error()[0], "a refusal without a message");
        return 0;
    }
    fuzz_accepted++;
    CHECK(c.vocab_size >= 1 && c.hidden_size >= 1 && c.num_hidden_layers >= 1, "sizes");
    CHECK(c.num_attention_heads % c.num_key_value_heads == 0 && c.head_dim % 2 == 0 && c.head_dim > 0, "heads");
    CHECK(c.n_eos >= 0 && c.n_eos <= QWEN3_MAX_EOS, "eos count");
    for (int i = 0; i < c.n_eos; i++) CHECK(c.eos_token_ids[i] >= 0 && c.eos_token_ids[i] < c.vocab_size, "eos id");
    CHECK(qwen3_config_n_params(&c) > 0, "n_params");
    return 0;
}

// The tiny tokenizer of tests/test_tokenizer.c: 256 byte tokens (id = the
// byte), merges h+e, l+l, he+ll, hell+o, added <|end|> (special) and <x>.
static char *tiny_tokenizer_json(void) {
    cJSON *root = cJSON_CreateObject(), *model = cJSON_CreateObject(), *vocab = cJSON_CreateObject();
    int n = 0;
    for (int b = 0; b < 256; b++) {
        int visible = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
        int cp = visible ? b : 256 + n++;
        char c[8];
        c[utf8proc_encode_char(cp, (utf8proc_uint8_t *)c)] = '\0';
        cJSON_AddNumberToObject(vocab, c, b);
    }
    static const char *merges[][3] = {{"h", "e", "he"}, {"l", "l", "ll"}, {"he", "ll", "hell"}, {"hell", "o", "hello"}};
    cJSON *ml = cJSON_CreateArray();
    for (int i = 0; i < 4; i++) {
        cJSON_AddNumberToObject(vocab, merges[i][2], 256 + i);
        cJSON_AddItemToArray(ml, cJSON_CreateStringArray(merges[i], 2));
    }
    cJSON_AddStringToObject(model, "type", "BPE");
    cJSON_AddItemToObject(model, "vocab", vocab);
    cJSON_AddItemToObject(model, "merges", ml);
    cJSON_AddItemToObject(root, "model", model);
    cJSON_AddItemToObject(root, "added_tokens",
                          cJSON_Parse("[{\"id\": 260, \"content\": \"<|end|>\", \"special\": true}, "
                                      "{\"id\": 261, \"content\": \"<x>\", \"special\": false}]"));
    cJSON_AddItemToObject(root, "normalizer", cJSON_Parse("{\"type\": \"NFC\"}"));
    cJSON *pre = cJSON_Parse("{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": "
                             "{\"Regex\": \"\"}, \"behavior\": \"Isolated\", \"invert\": false}, {\"type\": "
                             "\"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": false}]}");
    cJSON *pat = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(pre, "pretokenizers"), 0), "pattern");
    cJSON_ReplaceItemInObject(pat, "Regex",
                              cJSON_CreateString("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
                                                 "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"));
    cJSON_AddItemToObject(root, "pre_tokenizer", pre);
    cJSON_AddItemToObject(root, "decoder", cJSON_Parse("{\"type\": \"ByteLevel\"}"));
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return s;
}

static const char TOKENIZER_CONFIG[] = "{\"eos_token\": \"<|end|>\"}";

int fuzz_tokenizer_load(const uint8_t *data, size_t n) {
    fuzz_dir_init();
    put_file("tokenizer.json", data, n);
    put_file("tokenizer_config.json", (const uint8_t *)TOKENIZER_CONFIG, strlen(TOKENIZER_CONFIG));
    tokenizer_t *t = tokenizer_load(fuzz_dir);
    if (!t) {
        CHECK(mv_last_error()[0], "a refusal without a message");
        return 0;
    }
    fuzz_accepted++;
    tok_ids_t ids = {0};
    if (tokenizer_encode(t, "hello <|end|> world", 19, &ids) == 0)
        for (size_t i = 0; i < ids.len; i++) CHECK(ids.data[i] >= 0 && ids.data[i] < tokenizer_n_ids(t), "id range");
    tok_ids_free(&ids);
    tokenizer_free(t);
    return 0;
}

static tokenizer_t *encode_tok;  // the tokenizer fuzz_encode runs (tiny, or Qwen3's from MV_QWEN3_DIR)

static void encode_tok_init(void) {
    if (encode_tok) return;
    const char *q = getenv("MV_QWEN3_DIR");
    if (q && *q) encode_tok = tokenizer_load(q);
    if (!encode_tok) {
        fuzz_dir_init();
        char *s = tiny_tokenizer_json();
        put_file("tokenizer.json", (const uint8_t *)s, strlen(s));
        put_file("tokenizer_config.json", (const uint8_t *)TOKENIZER_CONFIG, strlen(TOKENIZER_CONFIG));
        free(s);
        encode_tok = tokenizer_load(fuzz_dir);
    }
    if (!encode_tok) abort();
}

int fuzz_encode(const uint8_t *data, size_t n) {
    encode_tok_init();
    tokenizer_t *t = encode_tok;
    tok_ids_t ids = {0};
    const char *s = (const char *)data;
    int valid = utf8_first_invalid(s, n) == n;
    int rc = tokenizer_encode(t, s, n, &ids);
    CHECK(valid ? rc == 0 : rc == -1, "valid UTF-8 %d, encode %d: %s", valid, rc, mv_last_error());
    if (rc) return 0;
    fuzz_accepted++;
    for (size_t i = 0; i < ids.len; i++) CHECK(ids.data[i] >= 0 && ids.data[i] < tokenizer_n_ids(t), "id range");
    tok_bytes_t batch = {0}, stream = {0};
    CHECK(tokenizer_decode(t, ids.data, ids.len, 0, &batch) == 0, "decode: %s", mv_last_error());
    tok_stream_t st;
    tok_stream_init(&st, 0);
    for (size_t i = 0; i < ids.len; i++) CHECK(tok_stream_push(t, &st, ids.data[i], &stream) == 0, "stream push");
    CHECK(tok_stream_flush(&st, &stream) == 0, "stream flush");
    CHECK(batch.len == stream.len && memcmp(batch.data, stream.data, batch.len) == 0, "stream != batch decode");
    // The text it must decode to, as Hugging Face's tokenizer makes it: the
    // added tokens are found in the raw text first (normalized: false), and
    // each piece between them is NFC-normalised on its own, so a combining
    // mark after the '>' of <think> stays a mark (NFC of the whole text would
    // compose '>' + U+0338 into U+226F). The pieces are found from the ids:
    // an id whose text is an added token's content is that token, matched at
    // the first place its content occurs (the encoder matches leftmost).
    tok_bytes_t want = {0}, one = {0};
    size_t cur = 0;
    for (size_t i = 0; i <= ids.len; i++) {
        size_t p = n;
        one.len = 0;
        if (i < ids.len) {
            CHECK(tokenizer_decode(t, &ids.data[i], 1, 0, &one) == 0, "decode one: %s", mv_last_error());
            if (one.len == 0 || tokenizer_token_id(t, one.data) != ids.data[i]) continue;
            const char *hit = memmem(data + cur, n - cur, one.data, one.len);
            CHECK(hit, "added token %d (%s) is not in the text after byte %zu", ids.data[i], one.data, cur);
            p = (size_t)(hit - s);
        }
        if (p > cur) {
            utf8proc_uint8_t *nfc = NULL;
            utf8proc_ssize_t m = utf8proc_map(data + cur, (utf8proc_ssize_t)(p - cur), &nfc, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
            CHECK(m >= 0, "utf8proc_map: %s", utf8proc_errmsg(m));
            tok_bytes_append(&want, (const char *)nfc, (size_t)m);
            free(nfc);
        }
        tok_bytes_append(&want, one.data ? one.data : "", one.len);
        cur = p + one.len;
    }
    CHECK(want.len == batch.len && (want.len == 0 || memcmp(want.data, batch.data, want.len) == 0),
          "decode(encode(x)) != NFC of the text between added tokens (%zu vs %zu bytes)", batch.len, want.len);
    tok_bytes_free(&want);
    tok_bytes_free(&one);
    tok_bytes_free(&batch);
    tok_bytes_free(&stream);
    tok_ids_free(&ids);
    return 0;
}

int fuzz_requests(const uint8_t *data, size_t n) {
    encode_tok_init();
    cli_requests_t c = {.path = "fuzz.jsonl", .tokenizer = encode_tok, .model_dir = "fuzz", .vocab_size = 512,
                        .defaults = {.temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .max_tokens = 16}};
    char *line = malloc(n + 1);
    if (!line) abort();
    memcpy(line, data, n);
    line[n] = '\0';
    int has_nul = memchr(data, 0, n) != NULL;
    if (cli_requests_add_line(&c, line, n, 1) == 0 && c.n >= 1) {
        fuzz_accepted++;
        CHECK(!has_nul, "a line holding a NUL byte was accepted");
        CHECK(c.n == c.reqs[0].n && c.n <= CLI_MAX_N, "a line of n = %d gave %d requests", c.reqs[0].n, c.n);
        for (int k = 0; k < c.n; k++) {  // "n": each sample the same request, sample k
            const cli_request_t *r = &c.reqs[k];
            CHECK(r->sample == k && r->prompt.len == c.reqs[0].prompt.len, "sample %d", k);
            CHECK(r->prompt.len > 0, "an empty prompt was accepted");
            for (size_t i = 0; i < r->prompt.len; i++)
                CHECK(r->prompt.data[i] >= 0 && (encode_tok || r->prompt.data[i] < 512), "prompt id %d",
                      r->prompt.data[i]);
            CHECK(r->params.max_tokens >= 1 && sampler_validate_params(&r->params) == 0, "sampling values: %s",
                  mv_last_error());
            for (int j = 0; j < r->stop.n; j++) CHECK(r->stop.ids[j] >= 0 && r->stop.ids[j] < 512, "stop id");
        }
    }
    cli_requests_free(&c);
    free(line);
    return 0;
}

// The server's bodies (serve/openai.c), the first byte choosing the endpoint:
// refused with an HTTP status and a message, or prompts inside the vocabulary
// and the context, and every choice's sampling values ones the sampler accepts.
int fuzz_api(const uint8_t *data, size_t n) {
    encode_tok_init();
    if (n == 0) return 0;
    const api_kind_t kind = data[0] & 1 ? API_CHAT : API_COMPLETIONS;
    const api_context_t ctx = {.served_model_name = "tiny", .tokenizer = encode_tok,
                               .vocab_size = tokenizer_n_ids(encode_tok), .max_model_len = 256,
                               .defaults = {.temperature = 0.6f, .top_k = 20, .top_p = 0.95f}};
    api_request_t r = {0};
    api_error_t err = {0};
    if (api_parse_request(kind, (const char *)data + 1, n - 1, &ctx, &r, &err)) {
        CHECK(err.status >= 400 && err.status < 600 && err.message[0], "a refusal with status %d and message '%s'",
              err.status, err.message);
    } else {
        fuzz_accepted++;
        CHECK(r.num_prompts >= 1 && r.n >= 1 && r.n <= API_MAX_N, "%d prompts, n %d", r.num_prompts, r.n);
        CHECK(api_num_choices(&r) == r.num_prompts * r.n, "choices %d", api_num_choices(&r));
        for (int i = 0; i < r.num_prompts; i++) {
            const tok_ids_t *p = &r.prompts[i];
            CHECK(p->len >= 1 && (int)p->len <= ctx.max_model_len, "prompt %d: %zu ids", i, p->len);
            for (size_t k = 0; k < p->len; k++)
                CHECK(p->data[k] >= 0 && p->data[k] < ctx.vocab_size, "prompt %d id %d", i, p->data[k]);
            sampling_params_t sp = r.params;
            sp.max_tokens = api_max_tokens(&r, &ctx, i);
            CHECK(sp.max_tokens >= 1 && sampler_validate_params(&sp) == 0, "prompt %d sampling: %s", i, mv_last_error());
        }
        for (int k = 0; k < r.num_stop_token_ids; k++)
            CHECK(r.stop_token_ids[k] >= 0 && r.stop_token_ids[k] < ctx.vocab_size, "stop id");
    }
    api_request_free(&r);
    return 0;
}

#ifdef MV_LIBFUZZER
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) { return MV_FUZZ_TARGET(data, n); }
#else

// ---- the deterministic mutation driver (CI) ----------------------------------------------------

typedef struct {
    uint64_t s;
} rng64_t;

static uint64_t next64(rng64_t *r) {
    r->s ^= r->s << 13, r->s ^= r->s >> 7, r->s ^= r->s << 17;
    return r->s;
}

static size_t below(rng64_t *r, size_t n) { return n ? (size_t)(next64(r) % n) : 0; }

// Tokens that JSON parsers, numbers and UTF-8 trip on.
static const char *const DICT[] = {
    "\"", "{", "}", "[", "]", ",", ":", "\\u0000", "\\", "\\ud800", "null", "true", "false", "-1", "0", "1e309",
    "9007199254740993", "-0", "1.5", "NaN", "\"dtype\"", "\"shape\"", "\"data_offsets\"", "\"BF16\"", "\"F32\"",
    "\"I64\"", "\"__metadata__\"", "\"vocab_size\"", "\"head_dim\"", "\"rope_scaling\"", "\"prompt\"",
    "\"prompt_token_ids\"", "\"messages\"", "\"max_tokens\"", "\"temperature\"", "\"top_p\"", "\"seed\"",
    "<|end|>", "<x>", "\xe4\xbd\xa0", "\xf0\x9f\x98\x80", "e\xcc\x81", "\xc3\xa9", " \t\n\r", "\xff", "\xc0\xaf",
    "\xed\xa0\x80", "\x00", "'s", "\xc2\x85", "\xe3\x80\x80", "          ", "hello",
};
enum { N_DICT = sizeof DICT / sizeof *DICT, FUZZ_MAX_INPUT = 1 << 16 };

// One to four random edits of buf[0..*n) (capacity FUZZ_MAX_INPUT).
static void mutate(rng64_t *r, uint8_t *buf, size_t *n, const uint8_t *other, size_t other_n) {
    int edits = 1 + (int)below(r, 4);
    for (int e = 0; e < edits; e++) {
        size_t at = below(r, *n + 1);
        switch (below(r, 8)) {
        case 0:  // flip a bit
            if (*n) buf[below(r, *n)] ^= (uint8_t)(1u << below(r, 8));
            break;
        case 1:  // a random byte
            if (*n) buf[below(r, *n)] = (uint8_t)next64(r);
            break;
        case 2:  // delete a run
            if (*n) {
                size_t k = 1 + below(r, *n - at < 16 ? *n - at + 1 : 16);
                if (at + k > *n) k = *n - at;
                memmove(buf + at, buf + at + k, *n - at - k);
                *n -= k;
            }
            break;
        case 3: case 4: {  // insert a dictionary token
            const char *d = DICT[below(r, N_DICT)];
            size_t k = d[0] ? strlen(d) : 1;
            if (*n + k <= FUZZ_MAX_INPUT) {
                memmove(buf + at + k, buf + at, *n - at);
                memcpy(buf + at, d, k);
                *n += k;
            }
            break;
        }
        case 5: {  // duplicate a run
            size_t k = below(r, 32), from = below(r, *n + 1);
            if (from + k > *n) k = *n - from;
            if (*n + k <= FUZZ_MAX_INPUT) {
                memmove(buf + at + k, buf + at, *n - at);
                memmove(buf + at, buf + from + (from >= at ? k : 0), k);
                *n += k;
            }
            break;
        }
        case 6:  // truncate
            *n = at;
            break;
        default: {  // splice in a piece of another seed
            size_t k = below(r, 64), from = below(r, other_n + 1);
            if (from + k > other_n) k = other_n - from;
            if (*n + k <= FUZZ_MAX_INPUT) {
                memmove(buf + at + k, buf + at, *n - at);
                memcpy(buf + at, other + from, k);
                *n += k;
            }
        }
        }
    }
}

typedef struct {
    const uint8_t *data;
    size_t n;
} seed_t;

static long env_long(const char *name, long dflt) {
    const char *v = getenv(name);
    return v && *v ? strtol(v, NULL, 10) : dflt;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// MV_FUZZ_WRITE_SEEDS=DIR: write each target's seeds to DIR/fuzz_NAME/seed-I,
// the corpus libFuzzer starts from (`make fuzz`; tests/fuzz/corpus/ is
// written this way: MV_FUZZ_WRITE_SEEDS=tests/fuzz/corpus build/tests/test_fuzz).
static void write_seeds(const char *name, const seed_t *seeds, int n_seeds) {
    const char *dir = getenv("MV_FUZZ_WRITE_SEEDS");
    if (!dir || !*dir) return;
    char path[4096];
    snprintf(path, sizeof path, "mkdir -p '%s/fuzz_%s'", dir, name);
    cr_assert_eq(system(path), 0, "%s failed", path);
    for (int i = 0; i < n_seeds; i++) {
        snprintf(path, sizeof path, "%s/fuzz_%s/seed-%d", dir, name, i);
        FILE *f = fopen(path, "wb");
        cr_assert_not_null(f, "cannot write %s", path);
        cr_assert_eq(fwrite(seeds[i].data, 1, seeds[i].n, f), seeds[i].n, "short write to %s", path);
        cr_assert_eq(fclose(f), 0, "cannot write %s", path);
    }
}

// Run every seed as it is, then mutants of them (each mutant of a seed or of
// the previous mutant), up to MV_FUZZ_RUNS runs or MV_FUZZ_SECONDS seconds.
static void drive(const char *name, int (*target)(const uint8_t *, size_t), const seed_t *seeds, int n_seeds,
                  long runs_default) {
    const long runs = env_long("MV_FUZZ_RUNS", runs_default);
    const double secs = (double)env_long("MV_FUZZ_SECONDS", 6);
    rng64_t r = {0x9e3779b97f4a7c15ull ^ (uint64_t)env_long("MV_FUZZ_SEED", 1) ^ (uint64_t)strlen(name) * 0x100000001b3ull};
    uint8_t *buf = malloc(FUZZ_MAX_INPUT);
    cr_assert_not_null(buf);
    size_t n = 0;
    write_seeds(name, seeds, n_seeds);
    double t0 = now_s();
    long execs = 0;
    for (int i = 0; i < n_seeds; i++, execs++) target(seeds[i].data, seeds[i].n);
    for (; execs < runs && now_s() - t0 < secs; execs++) {
        if (n == 0 || below(&r, 4) == 0) {  // back to a seed now and then
            const seed_t *s = &seeds[below(&r, (size_t)n_seeds)];
            n = s->n < FUZZ_MAX_INPUT ? s->n : FUZZ_MAX_INPUT;
            memcpy(buf, s->data, n);
        }
        const seed_t *o = &seeds[below(&r, (size_t)n_seeds)];
        mutate(&r, buf, &n, o->data, o->n);
        target(buf, n);
    }
    fprintf(stderr, "fuzz %-16s %8ld execs (%ld accepted, the rest refused cleanly) in %.1f s, no finding\n", name,
            execs, fuzz_accepted, now_s() - t0);
    free(buf);
}

static void remove_fuzz_dir(void) {
    if (!fuzz_dir[0]) return;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", fuzz_dir);
    if (system(cmd)) {}
}

TestSuite(fuzz, .fini = remove_fuzz_dir);

// A safetensors file of the given header JSON and data bytes.
static seed_t st_seed(const char *header, size_t data_n) {
    size_t h = strlen(header), n = 8 + h + data_n;
    uint8_t *b = calloc(1, n);
    uint64_t hl = h;
    memcpy(b, &hl, 8);
    memcpy(b + 8, header, h);
    for (size_t i = 0; i < data_n; i++) b[8 + h + i] = (uint8_t)(i * 37 + 1);
    return (seed_t){b, n};
}

Test(fuzz, safetensors_header_and_layout) {
    seed_t seeds[] = {
        st_seed("{}", 0),
        st_seed("{\"__metadata__\":{\"format\":\"pt\"},\"a\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[0,"
                "12]},\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[12,20]}}   ",
                20),
        st_seed("{\"model.norm.weight\":{\"dtype\":\"F16\",\"shape\":[8],\"data_offsets\":[0,16]},"
                "\"model.embed_tokens.weight\":{\"dtype\":\"BF16\",\"shape\":[16,8],\"data_offsets\":[16,272]}}",
                272),
        st_seed("{\"s\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]}}", 4),
    };
    drive("safetensors", fuzz_safetensors, seeds, 4, 40000);
    for (int i = 0; i < 4; i++) free((void *)seeds[i].data);
}

Test(fuzz, config_json) {
    char gen[] = "{\"eos_token_id\": 2, \"bos_token_id\": 1, \"temperature\": 0.6, \"top_k\": 20, \"top_p\": 0.95}";
    seed_t seeds[] = {{(const uint8_t *)CONFIG_SEED, strlen(CONFIG_SEED)},
                      {(const uint8_t *)"{\"architectures\":[\"Qwen3ForCausalLM\"]}", 38}};
    fuzz_dir_init();
    put_file("generation_config.json", (const uint8_t *)gen, strlen(gen));
    drive("config", fuzz_config, seeds, 2, 40000);
}

Test(fuzz, tokenizer_json_loading) {
    char *tiny = tiny_tokenizer_json();
    seed_t seeds[] = {{(const uint8_t *)tiny, strlen(tiny)}};
    drive("tokenizer_load", fuzz_tokenizer_load, seeds, 1, 10000);
    free(tiny);
}

Test(fuzz, tokenizer_encoding) {
    static const char *texts[] = {"Hello, world! It's 2024.", "你好，世界！\xf0\x9f\x98\x80", "e\xcc\x81t\xc3\xa9 cafe\xcc\x81",
                                  "<|end|>hello<x> <|end|>", "  \t\n\n   x  \r\n", "hell hello helllo 12345 'll",
                                  // libFuzzer's find: a combining mark after an added token's '>'
                                  "\xcc\x81\xc3\xa9<|end|>\xcc\xb8t\xc3\xa9 <think>\xcc\xb8 a>\xcc\xb8"};
    seed_t seeds[7];
    for (int i = 0; i < 7; i++) seeds[i] = (seed_t){(const uint8_t *)texts[i], strlen(texts[i])};
    drive("encode", fuzz_encode, seeds, 7, 100000);
}

Test(fuzz, request_lines) {
    static const char *lines[] = {
        "{\"prompt_token_ids\": [1, 2, 3], \"max_tokens\": 4, \"temperature\": 0.5, \"top_k\": 3, \"top_p\": 0.9}",
        "{\"prompt\": \"hello world\", \"seed\": 7, \"ignore_eos\": true}",
        "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"add_generation_prompt\": true}",
        "   ", "[1, 2]", "{\"prompt_token_ids\": [511, 0], \"max_tokens\": 1}"};
    seed_t seeds[6];
    for (int i = 0; i < 6; i++) seeds[i] = (seed_t){(const uint8_t *)lines[i], strlen(lines[i])};
    drive("requests", fuzz_requests, seeds, 6, 100000);
}

Test(fuzz, server_bodies) {
    // The first byte picks the endpoint: '0' completions, '1' chat.
    static const char *bodies[] = {
        "0{\"model\": \"tiny\", \"prompt\": [1, 2, 3], \"max_tokens\": 4, \"n\": 2, \"seed\": 3, \"logprobs\": 2}",
        "0{\"prompt\": [\"hello\", [5, 6]], \"presence_penalty\": 0.5, \"min_p\": 0.1, \"stream\": true, "
        "\"stream_options\": {\"include_usage\": true}, \"stop\": [\"\\n\"]}",
        "1{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"logprobs\": true, \"top_logprobs\": 3, "
        "\"min_tokens\": 2, \"max_tokens\": 8, \"repetition_penalty\": 1.2}",
        "1{\"messages\": [{\"role\": \"system\", \"content\": \"be brief\"}, {\"role\": \"user\", \"content\": \"x\"}], "
        "\"chat_template_kwargs\": {\"enable_thinking\": false}, \"stop_token_ids\": [2]}",
        "0{\"prompt\": \"a\", \"frequency_penalty\": 3}", "1{}", "0[]"};
    enum { N = sizeof bodies / sizeof *bodies };
    seed_t seeds[N];
    for (int i = 0; i < N; i++) seeds[i] = (seed_t){(const uint8_t *)bodies[i], strlen(bodies[i])};
    drive("api", fuzz_api, seeds, N, 100000);
}
#endif
