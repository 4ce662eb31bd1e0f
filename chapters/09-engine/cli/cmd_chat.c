/*
 * chapters/09-engine/cli/cmd_chat.c - `minivllm chat`: an interactive, multi-turn chat
 * at the terminal, the assistant's reply printed as it is sampled.
 *
 *   minivllm chat --model DIR [--no-thinking] [--system TEXT] [--max-tokens N] [--temperature T] ...
 *
 * Each line read from standard input is the user's next message ("/exit"
 * or the end of input ends the chat). The whole conversation so far goes
 * through Qwen3's chat template (text/chat.c) with the assistant's turn
 * opened, as vLLM's chat endpoint renders it, and the reply streams to
 * standard output token by token (flushed each time), then a newline. The
 * reply joins the conversation as the assistant's message: the template
 * drops the thinking of earlier turns, as Hugging Face's does. The prompt
 * "> " goes to standard error, and only when standard input is a terminal,
 * so `printf 'hi\nmore\n' | minivllm chat ...` prints the replies alone.
 *
 * Each turn is one engine_run of one request, the whole conversation as its
 * prompt: it is prefilled again every turn (the prefix cache's table lives
 * in one run's scheduler, not across runs). Greedy with --temperature 0: the replies are
 * `minivllm generate`'s for the same messages ("messages" lines of --input;
 * with --no-thinking, generate --chat for the first turn).
 *
 * Needs tokenizer.json (text in, text out). Exit status: 0 at the end of the
 * chat; 1 on a failure (a reply that failed, a conversation longer than
 * --max-model-len); 2 bad arguments.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "chapters/09-engine/cli/cli.h"
#include "chapters/09-engine/runtime/engine.h"
#include "chapters/09-engine/text/chat.h"
#include "common/check.h"

static const char CHAT_USAGE[] =
    "usage: minivllm chat --model DIR [--no-thinking] [--system TEXT] [--max-tokens N] [--temperature T]\n"
    "                     [--top-k K] [--top-p P] [--seed S] [--device cpu|cuda] [engine sizes...]\n"
    "\n"
    "An interactive chat with a Qwen3 model directory (it needs tokenizer.json). Each line of\n"
    "standard input is your next message; \"/exit\" or the end of input ends the chat. The whole\n"
    "conversation goes through Qwen3's chat template, and the reply is printed as it is sampled.\n"
    "--no-thinking: enable_thinking false (an empty <think></think>: the model answers at once).\n"
    "Sampling defaults come from generation_config.json (temperature 0 = greedy); --max-tokens\n"
    "defaults to what is left of --max-model-len. Turn i draws with seed S + i.";

typedef struct {
    const char *model, *system, *max_tokens, *temperature, *top_k, *top_p, *seed;
    cli_engine_args_t eng;
    int no_thinking;
} chat_args_t;

// The conversation: messages whose strings are malloc'd here.
typedef struct {
    chat_message_t *msgs;  // [n]
    int n, cap;
} conversation_t;

static int conv_push(conversation_t *c, const char *role, const char *content, size_t len) {
    if (c->n == c->cap) {
        int cap = c->cap ? 2 * c->cap : 8;
        chat_message_t *m = realloc(c->msgs, (size_t)cap * sizeof *m);
        if (!m) return mv_error("out of memory");
        c->msgs = m;
        c->cap = cap;
    }
    char *s = malloc(len + 1);
    if (!s) return mv_error("out of memory");
    memcpy(s, content, len);
    s[len] = '\0';
    c->msgs[c->n++] = (chat_message_t){role, s, NULL};
    return 0;
}

static void conv_free(conversation_t *c) {
    for (int i = 0; i < c->n; i++) free((char *)c->msgs[i].content);
    free(c->msgs);
}

typedef struct {
    const engine_t *e;
    stop_text_t dec;  // the reply's text (special tokens skipped), as it settles
    int failed;       // stdout could not be written
} turn_t;

static void print_settled(turn_t *t) {
    size_t n;
    const char *p = stop_text_take(&t->dec, &n);
    if ((n && fwrite(p, 1, n, stdout) != n) || fflush(stdout)) t->failed = 1;
}

// engine_hooks_t.on_token: the reply, printed as it comes. An eos (stop = 1) has no text.
static void on_token(void *ctx, int request, int32_t token, int stop, const engine_logprob_t *lp) {
    turn_t *t = ctx;
    (void)request;
    if (!stop && stop_text_push(&t->dec, token) >= 0) print_settled(t);
}

// One turn: the conversation rendered and run; the reply printed and appended to it.
static int run_turn(engine_t *e, conversation_t *conv, const chat_options_t *opt, sampling_params_t p,
                    int max_tokens_given, uint64_t seed) {
    tok_bytes_t text = {0};
    tok_ids_t ids = {0};
    turn_t t = {.e = e};
    engine_output_t out = {0};
    int rc = chat_render_qwen3(conv->msgs, conv->n, opt, &text);
    if (!rc) rc = tokenizer_encode(e->tokenizer, text.data, text.len, &ids);
    if (!rc && (int)ids.len >= e->cfg.max_model_len)
        rc = mv_error("the conversation is %zu tokens, and --max-model-len is %d: start a new chat or raise it",
                      ids.len, e->cfg.max_model_len);
    if (!rc && !max_tokens_given) p.max_tokens = e->cfg.max_model_len - (int)ids.len;
    if (!rc) rc = stop_text_init(&t.dec, e->tokenizer, NULL, 0, 0, 1);
    if (!rc) {
        const engine_request_t req = {ids.data, (int)ids.len, p, seed};
        const engine_hooks_t hooks = {.ctx = &t, .on_token = on_token};
        rc = engine_run(e, &req, 1, &out, &hooks) ? -1 : 0;
    }
    if (!rc && (stop_text_finish(&t.dec) || (print_settled(&t), 0) || t.failed || fputs("\n", stdout) == EOF ||
                fflush(stdout)))
        rc = mv_error("cannot write the reply to stdout");
    if (!rc && out.error) rc = mv_error("the reply failed: %s", out.error);
    // The reply joins the conversation: its whole text (the template strips its thinking later).
    if (!rc) rc = conv_push(conv, "assistant", t.dec.text.data, t.dec.text.len);
    engine_outputs_free(&out, 1);
    stop_text_free(&t.dec);
    tok_ids_free(&ids);
    tok_bytes_free(&text);
    return rc;
}

// Lines of stdin until EOF or "/exit", a turn each.
static int chat_loop(engine_t *e, const chat_args_t *a, sampling_params_t p, int max_tokens_given, uint64_t seed) {
    conversation_t conv = {0};
    const chat_options_t opt = {1, !a->no_thinking};
    const int tty = isatty(STDIN_FILENO);
    int rc = a->system ? conv_push(&conv, "system", a->system, strlen(a->system)) : 0;
    char *line = NULL;
    size_t cap = 0;
    for (uint64_t turn = 0; !rc; turn++) {
        if (tty) fputs("> ", stderr);
        ssize_t n = getline(&line, &cap, stdin);
        if (n < 0) break;
        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = '\0';
        if (strcmp(line, "/exit") == 0) break;
        if (utf8_first_invalid(line, (size_t)n) != (size_t)n || memchr(line, '\0', (size_t)n)) {
            rc = mv_error("line %llu is not valid UTF-8 text", (unsigned long long)turn + 1);
            break;
        }
        rc = conv_push(&conv, "user", line, (size_t)n) || run_turn(e, &conv, &opt, p, max_tokens_given, seed + turn);
    }
    free(line);
    conv_free(&conv);
    return rc;
}

int cmd_chat(int argc, char **argv) {
    chat_args_t a = {0};
    const cli_opt_t own[] = {
        {"--model", "DIR", "Hugging Face model directory (with tokenizer.json)", &a.model, NULL},
        {"--no-thinking", NULL, "enable_thinking false: an empty <think></think>, the model answers at once", NULL,
         &a.no_thinking},
        {"--system", "TEXT", "a system message first", &a.system, NULL},
        {"--max-tokens", "N", "most tokens per reply (default: what is left of --max-model-len)", &a.max_tokens, NULL},
        {"--temperature", "T", "0 = greedy (default: generation_config.json, else 1)", &a.temperature, NULL},
        {"--top-k", "K", "keep the K most likely tokens, 0 = off (default: generation_config.json)", &a.top_k, NULL},
        {"--top-p", "P", "nucleus in (0, 1], 1 = off (default: generation_config.json)", &a.top_p, NULL},
        {"--seed", "S", "turn i draws with seed S + i (default 0)", &a.seed, NULL},
    };
    enum { N_OWN = sizeof own / sizeof *own };
    cli_opt_t opts[N_OWN + CLI_ENGINE_N_OPTS];
    memcpy(opts, own, sizeof own);
    int n_opts = N_OWN + cli_engine_opts(&a.eng, opts + N_OWN);
    int st = cli_parse("chat", CHAT_USAGE, opts, n_opts, argc, argv);
    if (st == CLI_HELP) return CLI_OK;
    if (st != CLI_OK) return st;
    if (!a.model) return cli_error("chat", CLI_USAGE, "--model DIR is required");
    if ((st = cli_model_dir("chat", &a.model)) != CLI_OK) return st;
    engine_config_t ec = engine_config_default(a.model);
    if ((st = cli_engine_config("chat", &a.eng, &ec))) return st;
    if (cli_tp_follower("chat", &ec, &st)) return st;  // ranks other than 0 end here
    qwen3_config_t mc;
    if (qwen3_config_load(a.model, &mc)) return cli_error("chat", CLI_FAIL, "%s", mv_last_error());
    long max_tokens = 0, top_k = mc.top_k, seed = 0;
    sampling_params_t p = {.temperature = mc.temperature, .top_k = mc.top_k, .top_p = mc.top_p, .max_tokens = 1, .ignore_eos = 0};
    if (cli_parse_long("chat", "--max-tokens", a.max_tokens, 1, INT_MAX, &max_tokens) ||
        cli_parse_float("chat", "--temperature", a.temperature, 0, 1e6, 0, &p.temperature) ||
        cli_parse_long("chat", "--top-k", a.top_k, 0, INT_MAX, &top_k) ||
        cli_parse_float("chat", "--top-p", a.top_p, 0, 1, 1, &p.top_p) ||
        cli_parse_long("chat", "--seed", a.seed, 0, LONG_MAX, &seed))
        return CLI_USAGE;
    p.top_k = (int)top_k;
    if (a.max_tokens) p.max_tokens = (int)max_tokens;
    engine_t *e;
    if (engine_create(&ec, &e)) return cli_error("chat", CLI_FAIL, "%s", mv_last_error());
    int rc = 0;
    if (!e->tokenizer)
        rc = mv_error("chat needs a tokenizer (text in, text out), and %s has no tokenizer.json", a.model);
    else if (!tokenizer_has_qwen3_chat(e->tokenizer))
        rc = mv_error("%s: the chat template is not Qwen3's, the only one implemented", a.model);
    if (!rc) rc = chat_loop(e, &a, p, a.max_tokens != NULL, (uint64_t)seed);
    engine_free(e);
    return rc ? cli_error("chat", CLI_FAIL, "%s", mv_last_error()) : CLI_OK;
}
