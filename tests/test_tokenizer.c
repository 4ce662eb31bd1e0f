/*
 * tests/test_tokenizer.c - Criterion tests of the tokenizer, the chat format
 * and the `minivllm tokenize/detokenize` commands (chapters/09-engine/).
 *
 * Most tests use a tiny tokenizer.json written here to a temporary
 * directory: the 256 byte tokens (id = byte value), four merges, two added
 * tokens. The tests that need the real Qwen3 tokenizer find it through
 * MV_QWEN3_DIR and are skipped, saying so, when it is not set.
 * The id-for-id comparison with Hugging Face is tests/tokenizer/compare_hf.py.
 *
 * Run: make test  (or build/tests/test_tokenizer after make)
 */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <malloc.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <utf8proc.h>

#include "chapters/09-engine/text/chat.h"
#include "chapters/09-engine/text/tokenizer.h"
#include "common/check.h"
#include "tests/helpers.h"

#define QWEN_PATTERN                                                                                 \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|" \
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

// ---- a tiny tokenizer in a temporary directory -----------------------------------

static char tmp_dir[64];

// The byte-level character of byte b, as UTF-8 (see byte_level_table in tokenizer.c).
static void byte_char(int b, char out[8]) {
    int n = 0, cp = -1;
    for (int x = 0; x < 256; x++) {
        int visible = (x >= '!' && x <= '~') || (x >= 0xa1 && x <= 0xac) || (x >= 0xae && x <= 0xff);
        int c = visible ? x : 256 + n++;
        if (x == b) cp = c;
    }
    out[utf8proc_encode_char(cp, (utf8proc_uint8_t *)out)] = '\0';
}

static void write_file(const char *name, const char *text, size_t len) {
    char path[128];
    snprintf(path, sizeof path, "%s/%s", tmp_dir, name);
    FILE *f = fopen(path, "wb");
    cr_assert(f, "cannot write %s", path);
    fwrite(text, 1, len, f);
    fclose(f);
}

// merge_style: 0 = "a b" strings, 1 = ["a", "b"] pairs, 2 = both mixed.
static char *tiny_tokenizer_json(int merge_style) {
    cJSON *root = cJSON_CreateObject(), *model = cJSON_CreateObject(), *vocab = cJSON_CreateObject();
    for (int b = 0; b < 256; b++) {
        char c[8];
        byte_char(b, c);
        cJSON_AddNumberToObject(vocab, c, b);
    }
    // Merges in rank order: "he", "ll", "hell", "hello".
    static const char *merges[][3] = {{"h", "e", "he"}, {"l", "l", "ll"}, {"he", "ll", "hell"}, {"hell", "o", "hello"}};
    cJSON *ml = cJSON_CreateArray();
    for (int i = 0; i < 4; i++) {
        cJSON_AddNumberToObject(vocab, merges[i][2], 256 + i);
        if (merge_style == 0 || (merge_style == 2 && i % 2 == 0)) {
            char s[32];
            snprintf(s, sizeof s, "%s %s", merges[i][0], merges[i][1]);
            cJSON_AddItemToArray(ml, cJSON_CreateString(s));
        } else {
            cJSON_AddItemToArray(ml, cJSON_CreateStringArray(merges[i], 2));
        }
    }
    cJSON_AddStringToObject(model, "type", "BPE");
    cJSON_AddItemToObject(model, "vocab", vocab);
    cJSON_AddItemToObject(model, "merges", ml);
    cJSON *added = cJSON_CreateArray();
    static const struct { int id; const char *content; int special; } toks[] = {{260, "<|end|>", 1}, {261, "<x>", 0}};
    for (int i = 0; i < 2; i++) {
        cJSON *a = cJSON_CreateObject();
        cJSON_AddNumberToObject(a, "id", toks[i].id);
        cJSON_AddStringToObject(a, "content", toks[i].content);
        cJSON_AddBoolToObject(a, "special", toks[i].special);
        cJSON_AddBoolToObject(a, "normalized", 0);
        cJSON_AddItemToArray(added, a);
    }
    cJSON_AddItemToObject(root, "added_tokens", added);
    cJSON *norm = cJSON_CreateObject();
    cJSON_AddStringToObject(norm, "type", "NFC");
    cJSON_AddItemToObject(root, "normalizer", norm);
    cJSON *pre = cJSON_Parse("{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": "
                             "{\"Regex\": \"\"}, \"behavior\": \"Isolated\", \"invert\": false}, {\"type\": "
                             "\"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": false}]}");
    cJSON *pat = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(pre, "pretokenizers"), 0), "pattern");
    cJSON_ReplaceItemInObject(pat, "Regex", cJSON_CreateString(QWEN_PATTERN));
    cJSON_AddItemToObject(root, "pre_tokenizer", pre);
    cJSON_AddItemToObject(root, "decoder", cJSON_Parse("{\"type\": \"ByteLevel\"}"));
    cJSON_AddItemToObject(root, "model", model);
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return s;
}

static const char TINY_CONFIG[] =
    "{\"eos_token\": \"<|end|>\", \"chat_template\": \"not Qwen3's\"}";

static void write_tiny(int merge_style) {
    char *s = tiny_tokenizer_json(merge_style);
    write_file("tokenizer.json", s, strlen(s));
    free(s);
    write_file("tokenizer_config.json", TINY_CONFIG, strlen(TINY_CONFIG));
}

static void make_tmp(void) {
    strcpy(tmp_dir, "/tmp/mv_tok_XXXXXX");
    cr_assert(mkdtemp(tmp_dir));
    write_tiny(2);
}

static void remove_tmp(void) {
    char path[128];
    snprintf(path, sizeof path, "%s/tokenizer.json", tmp_dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", tmp_dir);
    unlink(path);
    rmdir(tmp_dir);
}

static tokenizer_t *load_tiny(void) {
    tokenizer_t *t = tokenizer_load(tmp_dir);
    cr_assert(t, "loading the tiny tokenizer failed: %s", mv_last_error());
    return t;
}

static void expect_ids(tokenizer_t *t, const char *text, const int32_t *want, size_t n) {
    tok_ids_t ids = {0};
    cr_assert_eq(tokenizer_encode(t, text, strlen(text), &ids), 0, "%s", mv_last_error());
    cr_expect_eq(ids.len, n, "\"%s\": %zu ids, expected %zu", text, ids.len, n);
    for (size_t i = 0; i < n && i < ids.len; i++)
        cr_expect_eq(ids.data[i], want[i], "\"%s\": id %zu is %d, expected %d", text, i, ids.data[i], want[i]);
    tok_ids_free(&ids);
}

// ---- merges, added tokens, the regex split -----------------------------------------

TestSuite(tiny, .init = make_tmp, .fini = remove_tmp);

Test(tiny, merges_by_rank_in_both_file_formats) {
    for (int style = 0; style < 3; style++) {  // "a b", ["a", "b"], mixed
        write_tiny(style);
        tokenizer_t *t = load_tiny();
        expect_ids(t, "hello", (int32_t[]){259}, 1);
        expect_ids(t, "hell", (int32_t[]){258}, 1);
        // "hel": "he" (rank 0) is merged; "l" stays alone.
        expect_ids(t, "hel", (int32_t[]){256, 'l'}, 2);
        // "ello": no "he", so "ll" then nothing: e, ll, o.
        expect_ids(t, "ello", (int32_t[]){'e', 257, 'o'}, 3);
        // The regex splits " hello" into one word " hello" whose first byte is a space.
        expect_ids(t, " hello", (int32_t[]){' ', 259}, 2);
        tokenizer_free(t);
    }
}

Test(tiny, added_tokens_matched_whole_before_bpe) {
    tokenizer_t *t = load_tiny();
    expect_ids(t, "hello<|end|>hello", (int32_t[]){259, 260, 259}, 3);
    expect_ids(t, "<x><|end|>", (int32_t[]){261, 260}, 2);
    // A near miss is ordinary text.
    expect_ids(t, "<|end", (int32_t[]){'<', '|', 'e', 'n', 'd'}, 5);
    cr_expect_eq(tokenizer_token_id(t, "<|end|>"), 260);
    cr_expect_eq(tokenizer_eos_id(t), 260);
    cr_expect(tokenizer_is_special(t, 260));
    cr_expect(!tokenizer_is_special(t, 261));
    cr_expect(!tokenizer_has_qwen3_chat(t));
    tokenizer_free(t);
}

Test(tiny, nfc_before_bpe) {
    tokenizer_t *t = load_tiny();
    // "e" + U+0301 is NFC-composed to U+00E9, bytes c3 a9.
    expect_ids(t, "e\xcc\x81", (int32_t[]){0xc3, 0xa9}, 2);
    tokenizer_free(t);
}

// ---- invalid input ------------------------------------------------------------------

Test(tiny, invalid_utf8_rejected_with_offset) {
    tokenizer_t *t = load_tiny();
    static const struct { const char *text; size_t len, offset; } cases[] = {
        {"ab\xff" "cd", 5, 2},          // never valid
        {"hello\xc0\xaf", 7, 5},        // overlong '/'
        {"x\xed\xa0\x80", 4, 1},        // a UTF-16 surrogate
        {"abc\xe4\xbd", 5, 3},          // cut short at the end
        {"\xf4\x90\x80\x80", 4, 0},     // past U+10FFFF
        {"ok \xe4\xbd\xa0 \x80", 8, 7}, // lone continuation byte after a valid one
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        tok_ids_t ids = {0};
        cr_expect_eq(tokenizer_encode(t, cases[i].text, cases[i].len, &ids), -1, "case %zu accepted", i);
        char want[64];
        snprintf(want, sizeof want, "byte offset %zu", cases[i].offset);
        cr_expect(strstr(mv_last_error(), want), "case %zu: \"%s\" lacks \"%s\"", i, mv_last_error(), want);
        cr_expect_eq(utf8_first_invalid(cases[i].text, cases[i].len), cases[i].offset);
        tok_ids_free(&ids);
    }
    tokenizer_free(t);
}

// An id the tokenizer does not know is a padding row of the model's
// vocabulary (Qwen3: 151,936 rows, 151,669 ids): it decodes to no text, as in
// Hugging Face and vLLM, in the batch and the streaming decoder alike. Only
// a negative id is an error.
Test(tiny, unknown_ids_have_no_text) {
    tokenizer_t *t = load_tiny();
    tok_bytes_t out = {0};
    cr_expect_eq(tokenizer_decode(t, (int32_t[]){104, 99999, 105, 262}, 4, 0, &out), 0, "%s", mv_last_error());
    cr_expect_str_eq(out.data, "hi");  // 262 is one past the last id
    cr_expect(!tokenizer_knows_id(t, 262) && !tokenizer_knows_id(t, 99999) && tokenizer_knows_id(t, 261));
    out.len = 0;
    tok_stream_t s;
    tok_stream_init(&s, 0);
    cr_expect_eq(tok_stream_push(t, &s, 0xe4, &out), 0);
    cr_expect_eq(tok_stream_push(t, &s, 5000, &out), 0, "an unknown id in the middle of a character");
    cr_expect_eq(tok_stream_push(t, &s, 0xbd, &out), 0);
    cr_expect_eq(tok_stream_push(t, &s, 0xa0, &out), 0);
    cr_expect_eq(tok_stream_flush(&s, &out), 0);
    cr_expect_str_eq(out.data, "\xe4\xbd\xa0", "the unknown id broke the character apart");
    cr_expect_eq(tokenizer_decode(t, (int32_t[]){-1}, 1, 0, &out), -1);
    cr_expect(strstr(mv_last_error(), "-1"), "%s", mv_last_error());
    cr_expect_eq(tok_stream_push(t, &s, -7, &out), -1);
    tok_bytes_free(&out);
    tokenizer_free(t);
}

static void expect_load_error(const char *dir, const char *needle) {
    tokenizer_t *t = tokenizer_load(dir);
    cr_expect_null(t, "loading should fail (%s)", needle);
    tokenizer_free(t);
    cr_expect(strstr(mv_last_error(), needle), "error \"%s\" lacks \"%s\"", mv_last_error(), needle);
}

Test(tiny, missing_files) {
    expect_load_error("/nonexistent/model", "cannot open /nonexistent/model/tokenizer.json");
    char path[128];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", tmp_dir);
    unlink(path);
    expect_load_error(tmp_dir, "tokenizer_config.json");
}

// tokenizer.json that is a directory: fopen opens it, and its "size" was
// LONG_MAX, asked of malloc. Now a message naming the path.
Test(tiny, tokenizer_json_that_is_a_directory) {
    char path[128];
    snprintf(path, sizeof path, "%s/tokenizer.json", tmp_dir);
    unlink(path);
    cr_assert_eq(mkdir(path, 0755), 0);
    expect_load_error(tmp_dir, "tokenizer.json is not a regular file (it is a directory)");
    rmdir(path);
}

// A pattern with \S inside [...] is refused; the pattern rewritten up to
// there used to leak. Loading it again and again must not grow the heap.
Test(tiny, regex_refused_without_a_leak) {
    char *good = tiny_tokenizer_json(0);
    // In the JSON text each backslash of the pattern is escaped: \\s+(?!\\S).
    const char *at = strstr(good, "\\\\s+(?!\\\\S)");
    cr_assert(at, "test setup: the pattern's \\s+(?!\\S) not found");
    size_t head = (size_t)(at - good);
    char *bad = malloc(strlen(good) + 16);
    memcpy(bad, good, head);
    strcpy(bad + head, "[\\\\S]");
    strcat(bad, at);
    write_file("tokenizer.json", bad, strlen(bad));
    expect_load_error(tmp_dir, "\\S inside [...]");
    // glibc's heap settles after a few loads (its per-thread caches fill): measure after that.
    for (int i = 0; i < 50; i++) tokenizer_free(tokenizer_load(tmp_dir));
    struct mallinfo2 before = mallinfo2();
    for (int i = 0; i < 300; i++) tokenizer_free(tokenizer_load(tmp_dir));
    struct mallinfo2 after = mallinfo2();
    // The leak was >= 64 bytes a load (the buffer's first capacity): 300
    // loads, >= 19 KB. (Under ASan mallinfo2 reads 0 and LeakSanitizer checks instead.)
    cr_expect_lt(after.uordblks - before.uordblks + 0.0, 4096.0, "%zu bytes more in use after 300 refused loads",
                 after.uordblks - before.uordblks);
    free(bad);
    free(good);
}

// Strict JSON in tokenizer.json: a key twice or a NUL in a string is an
// error naming it, not a first-or-last-wins guess.
Test(tiny, duplicate_key_and_nul_refused) {
    char *good = tiny_tokenizer_json(0);
    static const struct { const char *cut, *paste, *error; } edits[] = {
        {"\"type\":\"BPE\"", "\"type\":\"BPE\",\"type\":\"BPE\"", "key \"type\" appears twice (in model)"},
        {"\"content\":\"<x>\"", "\"content\":\"<x\\u0000>\"", "added_tokens[1].content holds a NUL"},
    };
    for (size_t i = 0; i < sizeof edits / sizeof edits[0]; i++) {
        const char *at = strstr(good, edits[i].cut);
        cr_assert(at, "test setup: \"%s\" not in the tiny tokenizer.json", edits[i].cut);
        size_t head = (size_t)(at - good);
        char *bad = malloc(strlen(good) + strlen(edits[i].paste) + 1);
        memcpy(bad, good, head);
        strcpy(bad + head, edits[i].paste);
        strcat(bad, at + strlen(edits[i].cut));
        write_file("tokenizer.json", bad, strlen(bad));
        expect_load_error(tmp_dir, edits[i].error);
        free(bad);
    }
    free(good);
}

Test(tiny, malformed_and_incomplete_json) {
    char *good = tiny_tokenizer_json(0);
    // Cut off half way: not JSON any more.
    write_file("tokenizer.json", good, strlen(good) / 2);
    expect_load_error(tmp_dir, "malformed JSON");
    write_file("tokenizer.json", "", 0);
    expect_load_error(tmp_dir, "malformed JSON");
    // Valid JSON, but pieces missing or wrong.
    static const struct { const char *cut, *paste, *error; } edits[] = {
        {"\"merges\":", "\"merges_gone\":", "model.merges must be an array"},
        {"\"vocab\":", "\"vocab_gone\":", "model.vocab must be an object"},
        {"\"type\":\"BPE\"", "\"type\":\"WordPiece\"", "model.type must be \"BPE\""},
        {"\"type\":\"NFC\"", "\"type\":\"NFKC\"", "normalizer must be"},
        {"\"he ll\"", "\"he zz\"", "not in the vocab"},
        {"\"l l\"", "\"l  l\"", "not two tokens"},
        {"\"added_tokens\":", "\"added_gone\":", "added_tokens must be an array"},
    };
    for (size_t i = 0; i < sizeof edits / sizeof edits[0]; i++) {
        const char *at = strstr(good, edits[i].cut);
        cr_assert(at, "test setup: \"%s\" not in the tiny tokenizer.json", edits[i].cut);
        size_t head = (size_t)(at - good), cut = strlen(edits[i].cut), paste = strlen(edits[i].paste);
        char *bad = malloc(strlen(good) + paste + 1);
        memcpy(bad, good, head);
        strcpy(bad + head, edits[i].paste);
        strcpy(bad + head + paste, at + cut);
        write_file("tokenizer.json", bad, strlen(bad));
        expect_load_error(tmp_dir, edits[i].error);
        free(bad);
    }
    free(good);
}

// ---- decoding -----------------------------------------------------------------------

static void expect_decode(tokenizer_t *t, const int32_t *ids, size_t n, const char *want) {
    tok_bytes_t out = {0};
    cr_assert_eq(tokenizer_decode(t, ids, n, 0, &out), 0, "%s", mv_last_error());
    cr_expect_str_eq(out.data, want);
    tok_bytes_free(&out);
}

Test(tiny, decode_replaces_invalid_bytes) {
    tokenizer_t *t = load_tiny();
    expect_decode(t, (int32_t[]){259, ' ', 0xe4, 0xbd, 0xa0}, 5, "hello \xe4\xbd\xa0");
    expect_decode(t, (int32_t[]){0xff}, 1, "\xef\xbf\xbd");
    // A cut-short sequence is one U+FFFD (its maximal valid prefix), then 'a'.
    expect_decode(t, (int32_t[]){0xe4, 0xbd, 'a'}, 3, "\xef\xbf\xbd" "a");
    // 0xe0 0x80: 0x80 cannot follow 0xe0, so two replacements.
    expect_decode(t, (int32_t[]){0xe0, 0x80}, 2, "\xef\xbf\xbd\xef\xbf\xbd");
    expect_decode(t, (int32_t[]){260, 261}, 2, "<|end|><x>");
    tok_bytes_t out = {0};
    cr_assert_eq(tokenizer_decode(t, (int32_t[]){260, 261, 'a'}, 3, 1, &out), 0);
    cr_expect_str_eq(out.data, "<x>a", "skip_special drops only special tokens");
    tok_bytes_free(&out);
    tokenizer_free(t);
}

Test(tiny, stream_holds_back_partial_utf8) {
    tokenizer_t *t = load_tiny();
    tok_stream_t s;
    tok_stream_init(&s, 0);
    tok_bytes_t out = {0};
    // "你" is e4 bd a0: nothing comes out until the third byte arrives.
    cr_assert_eq(tok_stream_push(t, &s, 0xe4, &out), 0);
    cr_expect_eq(out.len, 0);
    cr_assert_eq(tok_stream_push(t, &s, 0xbd, &out), 0);
    cr_expect_eq(out.len, 0);
    cr_assert_eq(tok_stream_push(t, &s, 0xa0, &out), 0);
    cr_expect_str_eq(out.data, "\xe4\xbd\xa0");
    // A 4-byte emoji across tokens, then a word.
    out.len = 0;
    int32_t emoji[] = {0xf0, 0x9f, 0x98, 0x80, 259};
    for (int i = 0; i < 5; i++) {
        cr_assert_eq(tok_stream_push(t, &s, emoji[i], &out), 0);
        if (i < 3) cr_expect_eq(out.len, 0, "byte %d of the emoji let text out", i);
    }
    cr_expect_str_eq(out.data, "\xf0\x9f\x98\x80hello");
    // A broken sequence is replaced as soon as it is known to be broken.
    out.len = 0;
    cr_assert_eq(tok_stream_push(t, &s, 0xe4, &out), 0);
    cr_assert_eq(tok_stream_push(t, &s, 'a', &out), 0);
    cr_expect_str_eq(out.data, "\xef\xbf\xbd" "a");
    // At the end of the stream, what is held becomes U+FFFD.
    out.len = 0;
    cr_assert_eq(tok_stream_push(t, &s, 0xf0, &out), 0);
    cr_assert_eq(tok_stream_push(t, &s, 0x9f, &out), 0);
    cr_expect_eq(out.len, 0);
    cr_assert_eq(tok_stream_flush(&s, &out), 0);
    cr_expect_str_eq(out.data, "\xef\xbf\xbd");
    tok_bytes_free(&out);
    tokenizer_free(t);
}

// ---- the chat format ------------------------------------------------------------------

static void expect_chat(const chat_message_t *m, int n, chat_options_t opt, const char *want) {
    tok_bytes_t out = {0};
    cr_assert_eq(chat_render_qwen3(m, n, &opt, &out), 0, "%s", mv_last_error());
    cr_expect_str_eq(out.data, want);
    tok_bytes_free(&out);
}

Test(chat, qwen3_cases) {
    chat_message_t m[] = {{"system", "Be brief.", NULL}, {"user", "Hi", NULL}};
    expect_chat(m, 2, (chat_options_t){1, 1},
                "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
    expect_chat(m + 1, 1, (chat_options_t){1, 0},
                "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
    // The last answer keeps its thinking; an earlier one loses it.
    chat_message_t turns[] = {{"user", "Q1", NULL},
                              {"assistant", "<think>\nold\n</think>\n\nA1", NULL},
                              {"user", "Q2", NULL},
                              {"assistant", "A2", "new"}};
    expect_chat(turns, 4, (chat_options_t){0, 1},
                "<|im_start|>user\nQ1<|im_end|>\n<|im_start|>assistant\nA1<|im_end|>\n"
                "<|im_start|>user\nQ2<|im_end|>\n<|im_start|>assistant\n<think>\nnew\n</think>\n\nA2<|im_end|>\n");
}

Test(chat, bad_requests) {
    tok_bytes_t out = {0};
    chat_options_t opt = {1, 1};
    cr_expect_eq(chat_render_qwen3(NULL, 0, &opt, &out), -1);
    chat_message_t m[] = {{"robot", "x", NULL}};
    cr_expect_eq(chat_render_qwen3(m, 1, &opt, &out), -1);
    cr_expect(strstr(mv_last_error(), "robot"), "%s", mv_last_error());
    cJSON *req = cJSON_Parse("{\"messages\": [{\"role\": \"user\", \"content\": 3}]}");
    chat_message_t *msgs;
    int n;
    cr_expect_eq(chat_request_from_json(req, &msgs, &n, &opt), -1);
    cJSON_Delete(req);
    req = cJSON_Parse("{\"messages\": [], \"enable_thinking\": \"no\"}");
    cr_expect_eq(chat_request_from_json(req, &msgs, &n, &opt), -1);
    cr_expect(strstr(mv_last_error(), "enable_thinking"), "%s", mv_last_error());
    cJSON_Delete(req);
    tok_bytes_free(&out);
}

// ---- the real Qwen3 tokenizer (MV_QWEN3_DIR) -------------------------------------------

static const char *qwen3_dir(void) { return qwen3_dir_or_skip("the real Qwen3 tokenizer tests are"); }

Test(qwen3, known_encodings) {
    tokenizer_t *t = tokenizer_load(qwen3_dir());
    cr_assert(t, "%s", mv_last_error());
    // Ids from Hugging Face tokenizers 0.21.1 (Tokenizer.from_file(...).encode(text).ids).
    expect_ids(t, "Hello, world!", (int32_t[]){9707, 11, 1879, 0}, 4);
    expect_ids(t, "<|im_start|>user\nHi<|im_end|>\n", (int32_t[]){151644, 872, 198, 13048, 151645, 198}, 6);
    expect_ids(t, "你好世界", (int32_t[]){108386, 99489}, 2);
    expect_ids(t, "12345", (int32_t[]){16, 17, 18, 19, 20}, 5);
    cr_expect_eq(tokenizer_eos_id(t), 151645);
    cr_expect_eq(tokenizer_n_ids(t), 151669);
    cr_expect(tokenizer_has_qwen3_chat(t));
    cr_expect(tokenizer_uses_jit(t) == 0 || tokenizer_uses_jit(t) == 1);
    tokenizer_free(t);
}

// Run build/minivllm with the arguments; return its exit status and stdout.
static int run_minivllm(const char *args, char *out, size_t cap) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s/minivllm %s 2>/dev/null", MV_BUILD_DIR, args);
    return run_command(cmd, out, cap);
}

Test(qwen3, command_line) {
    const char *dir = qwen3_dir();
    char args[512], out[4096];
    snprintf(args, sizeof args, "tokenize --model '%s' --text 'Hello, world!'", dir);
    cr_expect_eq(run_minivllm(args, out, sizeof out), 0);
    cr_expect_str_eq(out, "[9707, 11, 1879, 0]\n");
    snprintf(args, sizeof args, "detokenize --model '%s' --ids 9707,11,1879,0", dir);
    cr_expect_eq(run_minivllm(args, out, sizeof out), 0);
    cr_expect_str_eq(out, "Hello, world!\n");
    snprintf(args, sizeof args, "tokenize --model '%s' --text \"$(printf 'bad \\377 byte')\"", dir);
    cr_expect_eq(run_minivllm(args, out, sizeof out), 1, "invalid UTF-8 must fail");
    // 151669 .. 151935 are padding rows of Qwen3's vocabulary: no text, no failure.
    snprintf(args, sizeof args, "detokenize --model '%s' --ids 9707,151769,0", dir);
    cr_expect_eq(run_minivllm(args, out, sizeof out), 0, "%s", out);
    cr_expect_str_eq(out, "Hello!\n");
    snprintf(args, sizeof args, "detokenize --model '%s' --ids 1,-5", dir);
    cr_expect_eq(run_minivllm(args, out, sizeof out), 1, "a negative id must fail");
}

Test(cli, usage_errors_exit_2) {
    char out[4096];
    cr_expect_eq(run_minivllm("", out, sizeof out), 2);
    cr_expect_eq(run_minivllm("frobnicate", out, sizeof out), 2);
    cr_expect_eq(run_minivllm("tokenize --model x --txet hi", out, sizeof out), 2);
    cr_expect_eq(run_minivllm("tokenize --text hi", out, sizeof out), 2, "--model is required");
    cr_expect_eq(run_minivllm("detokenize --model x --ids 1,two", out, sizeof out), 2);
    cr_expect_eq(run_minivllm("--help", out, sizeof out), 0);
    cr_expect(strstr(out, "tokenize") && strstr(out, "detokenize"));
    cr_expect_eq(run_minivllm("tokenize --help", out, sizeof out), 0);
    cr_expect(strstr(out, "--input"));
    cr_expect_eq(run_minivllm("tokenize --model /nonexistent --text hi", out, sizeof out), 1);
}
