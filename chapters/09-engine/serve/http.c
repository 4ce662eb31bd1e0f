/*
 * chapters/09-engine/serve/http.c - routes, bodies and streams over libmicrohttpd (see http.h).
 *
 * libmicrohttpd calls on_request several times per request: once with the
 * headers (*con_cls still NULL: the route, the method, the key and the
 * Content-Length are checked then), once per piece of the body, and once
 * more with no data when the body is complete. In thread-per-connection
 * mode each connection has its own thread, so a handler may block: a
 * non-streaming request waits there for its job; a streaming one returns a
 * response whose content reader (stream_read) blocks for the next tokens.
 * While it waits it looks at the socket every WAIT_MS: a client that has
 * closed it is gone, and its request is aborted.
 */
#include "chapters/09-engine/serve/http.h"

#include <cjson/cJSON.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common/check.h"

enum { WAIT_MS = 100 };

struct http_server {
    http_config_t cfg;
    struct MHD_Daemon *daemon;
    int port;
    int active;             // requests in progress (__atomic)
    long long next_id;      // for the response ids (__atomic)
};

typedef enum { ROUTE_COMPLETIONS, ROUTE_CHAT, ROUTE_MODELS, ROUTE_HEALTH, ROUTE_METRICS } route_t;

static const struct {
    const char *path;
    const char *method;
    route_t route;
} ROUTES[] = {
    {"/v1/completions", "POST", ROUTE_COMPLETIONS}, {"/v1/chat/completions", "POST", ROUTE_CHAT},
    {"/v1/models", "GET", ROUTE_MODELS},           {"/health", "GET", ROUTE_HEALTH},
    {"/metrics", "GET", ROUTE_METRICS},
};

// What one choice's stream has sent so far.
typedef struct {
    int consumed;        // tokens turned into text
    stop_text_t dec;     // the streaming decoder and the request's stop strings (with a tokenizer):
                         // an unfinished UTF-8 character, or text that may be the start of a stop
                         // string, waits in it until the next token settles it
    int lp_offset;       // completions with logprobs: text_offset of the next token
    int finish_sent;
} choice_stream_t;

// One request on a connection (*con_cls).
typedef struct {
    http_server_t *srv;
    struct MHD_Connection *conn;
    route_t route;
    tok_bytes_t body;
    int too_large;
    serve_job_t *job;            // once submitted
    char id[48];                 // "cmpl-..." / "chatcmpl-..."
    long long created;
    // streaming
    choice_stream_t *choices;    // [num_choices] = job->num_subs
    int num_choices;
    int role_sent, ended;
    tok_bytes_t out;             // bytes made, not yet handed to MHD
    size_t out_off;
    tok_bytes_t text;            // scratch
} request_t;

// ---- answers ---------------------------------------------------------------------------

static enum MHD_Result respond(struct MHD_Connection *conn, unsigned status, const char *type, const char *body,
                               size_t len) {
    struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    if (status == MHD_HTTP_UNAUTHORIZED) MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    enum MHD_Result rc = MHD_queue_response(conn, status, r);
    MHD_destroy_response(r);
    return rc;
}

static enum MHD_Result respond_error(struct MHD_Connection *conn, const api_error_t *err) {
    char *j = api_error_json(err);
    if (!j) return MHD_NO;
    enum MHD_Result rc = respond(conn, (unsigned)err->status, "application/json", j, strlen(j));
    free(j);
    return rc;
}

static enum MHD_Result fail(struct MHD_Connection *conn, int status, const char *param, const char *code,
                            const char *msg) {
    api_error_t err;
    api_fail(&err, status, param, code, "%s", msg);
    return respond_error(conn, &err);
}

// ---- the client's socket -------------------------------------------------------------------

// 1 when the client has closed its end (it will read no answer).
static int client_gone(struct MHD_Connection *conn) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return 0;
    struct pollfd p = {.fd = ci->connect_fd, .events = POLLRDHUP};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

static struct timespec deadline_ms(int ms) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    t.tv_nsec += (long)ms * 1000000L;
    t.tv_sec += t.tv_nsec / 1000000000L;
    t.tv_nsec %= 1000000000L;
    return t;
}

static int job_over(const serve_job_t *j) {
    return j->state == JOB_DONE || j->state == JOB_REJECTED || j->state == JOB_FAILED;
}

// Wait (job->mu held) until done() or WAIT_MS passed. 1 when done() holds.
static int wait_job(serve_job_t *j, int (*done)(const serve_job_t *)) {
    if (done(j)) return 1;
    struct timespec until = deadline_ms(WAIT_MS);
    pthread_cond_timedwait(&j->cv, &j->mu, &until);
    return done(j);
}

static int job_admitted(const serve_job_t *j) { return j->state != JOB_QUEUED; }

// Wait until done(job), looking at the socket meanwhile. 0, or -1 when the
// client went away (its job aborted).
static int wait_for(request_t *q, int (*done)(const serve_job_t *)) {
    serve_job_t *j = q->job;
    for (;;) {
        pthread_mutex_lock(&j->mu);
        int ok = wait_job(j, done);
        pthread_mutex_unlock(&j->mu);
        if (ok) return 0;
        if (client_gone(q->conn)) {
            serve_engine_abort(q->srv->cfg.engine, j);
            return -1;
        }
    }
}

// ---- streaming --------------------------------------------------------------------------------

static api_choice_t choice_of(const serve_job_t *j, int i) {
    const serve_sub_t *u = &j->subs[i];
    return (api_choice_t){&u->out, u->req.prompt, u->req.num_prompt};
}

// Whether the job has something the stream has not sent (job->mu held).
static int stream_has_news(const request_t *q) {
    const serve_job_t *j = q->job;
    if (j->state == JOB_FAILED) return 1;
    for (int i = 0; i < j->num_subs; i++)
        if (j->subs[i].num_tokens > q->choices[i].consumed || (j->subs[i].finished && !q->choices[i].finish_sent))
            return 1;
    return 0;
}

// Turn what the engine has produced since the last call into SSE events in q->out.
// Called without job->mu; takes it to copy the new tokens.
static int stream_fill(request_t *q) {
    serve_job_t *j = q->job;
    const http_server_t *s = q->srv;
    const api_context_t *ctx = &s->cfg.api;
    const api_request_t *r = &j->api;
    int rc = 0;
    if (r->kind == API_CHAT && !q->role_sent) {
        for (int i = 0; !rc && i < j->num_subs; i++) rc = api_chunk_role(r, ctx, q->id, q->created, i, &q->out);
        q->role_sent = 1;
        if (rc) return -1;
    }
    pthread_mutex_lock(&j->mu);
    if (!stream_has_news(q)) {
        struct timespec until = deadline_ms(WAIT_MS);
        pthread_cond_timedwait(&j->cv, &j->mu, &until);
    }
    const job_state_t state = j->state;
    const api_error_t err = j->error;
    // Each choice's new tokens, decoded under the lock: the token array may
    // move (realloc) when the engine appends, and decoding a few tokens is quick.
    int all_done = 1;
    for (int i = 0; !rc && i < j->num_subs; i++) {
        serve_sub_t *u = &j->subs[i];
        choice_stream_t *c = &q->choices[i];
        q->text.len = 0;
        rc = tok_bytes_append(&q->text, "", 0);
        const int first = c->consumed;
        for (; !rc && c->consumed < u->num_tokens; c->consumed++) {
            const int is_stop = u->last_is_stop && c->consumed == u->num_tokens - 1;
            if (!is_stop && ctx->tokenizer) rc = stop_text_push(&c->dec, u->tokens[c->consumed]) < 0;
        }
        const int finish = u->finished && !c->finish_sent;
        if (!rc && finish && ctx->tokenizer) rc = stop_text_finish(&c->dec);
        if (!rc && ctx->tokenizer) {
            // What is settled: never a piece of a stop string that is then cut.
            size_t n;
            const char *p = stop_text_take(&c->dec, &n);
            rc = tok_bytes_append(&q->text, p, n);
        }
        // Each chunk carries the logprobs of the tokens consumed for it (the
        // stop id's too, and those whose text is still held back), so the
        // chunks' logprobs add up to the whole answer's.
        const int with_lp = r->params.logprobs && u->lps;
        const api_logprobs_t lp = {u->tokens + first, with_lp ? u->lps + first : NULL, c->consumed - first,
                                   &c->lp_offset};
        if (!rc && (q->text.len > 0 || finish || (with_lp && lp.n > 0))) {
            api_choice_t ch = choice_of(j, i);
            rc = api_chunk_text(r, ctx, q->id, q->created, i, q->text.data, q->text.len, with_lp && lp.n > 0 ? &lp : NULL,
                                finish ? &ch : NULL, &q->out);
        }
        if (finish) c->finish_sent = 1;
        all_done &= c->finish_sent;
    }
    if (!rc && state == JOB_FAILED) {
        rc = api_chunk_error(&err, &q->out) || api_chunk_done(&q->out);
        q->ended = 1;
    } else if (!rc && all_done) {
        if (r->include_usage) {
            api_choice_t *cs = malloc((size_t)j->num_subs * sizeof *cs);
            for (int i = 0; cs && i < j->num_subs; i++) cs[i] = choice_of(j, i);
            rc = !cs || api_chunk_usage(r, ctx, q->id, q->created, cs, j->num_subs, &q->out);
            free(cs);
        }
        rc = rc || api_chunk_done(&q->out);
        q->ended = 1;
    }
    pthread_mutex_unlock(&j->mu);
    return rc ? -1 : 0;
}

// libmicrohttpd's content reader: the next bytes of the event stream.
// Blocks until the engine has something (thread-per-connection mode).
static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    request_t *q = cls;
    (void)pos;
    for (;;) {
        if (q->out_off < q->out.len) {
            size_t n = q->out.len - q->out_off < max ? q->out.len - q->out_off : max;
            memcpy(buf, q->out.data + q->out_off, n);
            q->out_off += n;
            if (q->out_off == q->out.len) q->out_off = q->out.len = 0;
            return (ssize_t)n;
        }
        if (q->ended) {
            // The engine is done with it: idle time counts again from now.
            MHD_set_connection_option(q->conn, MHD_CONNECTION_OPTION_TIMEOUT, q->srv->cfg.timeout_s);
            return MHD_CONTENT_READER_END_OF_STREAM;
        }
        if (stream_fill(q)) return MHD_CONTENT_READER_END_WITH_ERROR;
        if (q->out.len == 0 && !q->ended && client_gone(q->conn)) {
            serve_engine_abort(q->srv->cfg.engine, q->job);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
    }
}

// ---- the endpoints ------------------------------------------------------------------------------

static enum MHD_Result answer_whole(request_t *q) {
    serve_job_t *j = q->job;
    if (wait_for(q, job_over)) return MHD_NO;
    MHD_set_connection_option(q->conn, MHD_CONNECTION_OPTION_TIMEOUT, q->srv->cfg.timeout_s);
    if (j->state == JOB_FAILED) return respond_error(q->conn, &j->error);
    api_choice_t *cs = calloc((size_t)j->num_subs, sizeof *cs);
    tok_bytes_t b = {0};
    int rc = cs ? 0 : -1;
    for (int i = 0; cs && i < j->num_subs; i++) cs[i] = choice_of(j, i);
    if (!rc) rc = api_response_json(&j->api, &q->srv->cfg.api, q->id, q->created, cs, j->num_subs, &b);
    free(cs);
    enum MHD_Result res = rc ? fail(q->conn, 500, NULL, NULL, "out of memory")
                             : respond(q->conn, 200, "application/json", b.data, b.len);
    tok_bytes_free(&b);
    return res;
}

static enum MHD_Result answer_stream(request_t *q) {
    q->choices = calloc((size_t)q->job->num_subs, sizeof *q->choices);
    if (!q->choices) return fail(q->conn, 500, NULL, NULL, "out of memory");
    q->num_choices = q->job->num_subs;
    const api_request_t *api = &q->job->api;
    for (int i = 0; i < q->job->num_subs; i++) {
        if (!q->srv->cfg.api.tokenizer) continue;
        if (stop_text_init(&q->choices[i].dec, q->srv->cfg.api.tokenizer, (const char *const *)api->stop,
                           api->num_stop, api->include_stop_str_in_output, api->skip_special_tokens))
            return fail(q->conn, 500, NULL, NULL, mv_last_error());
        // As the engine's own stop_text: no stop string before min_tokens tokens.
        q->choices[i].dec.min_tokens = q->job->subs[i].req.params.min_tokens;
    }
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, stream_read, q, NULL);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    enum MHD_Result rc = MHD_queue_response(q->conn, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    return rc;
}

static enum MHD_Result generate(request_t *q) {
    http_server_t *s = q->srv;
    const api_kind_t kind = q->route == ROUTE_CHAT ? API_CHAT : API_COMPLETIONS;
    api_request_t r;
    api_error_t err;
    if (api_parse_request(kind, q->body.data ? q->body.data : "", q->body.len, &s->cfg.api, &r, &err)) {
        api_request_free(&r);
        return respond_error(q->conn, &err);
    }
    serve_job_t *j = serve_job_create(&r, &s->cfg.api);
    if (!j) {
        api_request_free(&r);
        return fail(q->conn, 500, NULL, NULL, "out of memory");
    }
    if (serve_engine_submit(s->cfg.engine, j, &err)) {
        serve_job_release(j);
        return respond_error(q->conn, &err);
    }
    q->job = j;
    snprintf(q->id, sizeof q->id, "%s-%016llx", kind == API_CHAT ? "chatcmpl" : "cmpl",
             (unsigned long long)__atomic_add_fetch(&s->next_id, 1, __ATOMIC_RELAXED));
    q->created = (long long)time(NULL);
    // No idle timeout while the engine works on it (a long queue is not an idle client).
    MHD_set_connection_option(q->conn, MHD_CONNECTION_OPTION_TIMEOUT, 0);
    if (wait_for(q, job_admitted)) return MHD_NO;
    if (j->state == JOB_REJECTED || j->state == JOB_FAILED) {
        MHD_set_connection_option(q->conn, MHD_CONNECTION_OPTION_TIMEOUT, s->cfg.timeout_s);
        return respond_error(q->conn, &j->error);
    }
    return j->api.stream ? answer_stream(q) : answer_whole(q);
}

static enum MHD_Result models(request_t *q) {
    const http_server_t *s = q->srv;
    cJSON *node = cJSON_CreateStringReference(s->cfg.api.served_model_name);
    char *name = node ? cJSON_PrintUnformatted(node) : NULL;  // the name as a JSON string
    cJSON_Delete(node);
    char body[1024];
    snprintf(body, sizeof body,
             "{\"object\":\"list\",\"data\":[{\"id\":%s,\"object\":\"model\",\"created\":%lld,\"owned_by\":"
             "\"minivllm\",\"root\":%s,\"max_model_len\":%d}]}",
             name ? name : "\"\"", (long long)time(NULL), name ? name : "\"\"", s->cfg.max_model_len);
    free(name);
    return respond(q->conn, 200, "application/json", body, strlen(body));
}

static enum MHD_Result metrics(request_t *q) {
    tok_bytes_t b = {0};
    enum MHD_Result rc = serve_engine_metrics(q->srv->cfg.engine, &b)
                             ? fail(q->conn, 500, NULL, NULL, "out of memory")
                             : respond(q->conn, 200, "text/plain; version=0.0.4", b.data, b.len);
    tok_bytes_free(&b);
    return rc;
}

static enum MHD_Result health(request_t *q) {
    char why[600];
    if (serve_engine_health(q->srv->cfg.engine, why, sizeof why)) return fail(q->conn, 500, NULL, "engine_failed", why);
    return respond(q->conn, 200, "text/plain", "", 0);
}

// ---- the first call: route, method, key, size ------------------------------------------------

static int key_ok(const http_server_t *s, struct MHD_Connection *conn) {
    if (!s->cfg.api_key) return 1;
    const char *h = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!h || strncmp(h, "Bearer ", 7) != 0) return 0;
    const char *k = h + 7, *want = s->cfg.api_key;
    size_t n = strlen(k), m = strlen(want);
    unsigned char diff = (unsigned char)(n != m);
    // Compare every byte whatever the first mismatch: the time says nothing about the key.
    for (size_t i = 0; i < m; i++) diff |= (unsigned char)(want[i] ^ (i < n ? k[i] : 0));
    return diff == 0;
}

// The route of (url, method), or an answer already queued (*answered).
static enum MHD_Result first_call(http_server_t *s, request_t *q, const char *url, const char *method, int *answered) {
    *answered = 1;
    int path = -1;
    for (size_t i = 0; i < sizeof ROUTES / sizeof *ROUTES && path < 0; i++)
        if (strcmp(url, ROUTES[i].path) == 0) path = (int)i;
    if (path < 0) {
        char msg[300];
        snprintf(msg, sizeof msg, "no such path: %.200s", url);
        return fail(q->conn, 404, NULL, "not_found", msg);
    }
    if (strncmp(url, "/v1/", 4) == 0 && !key_ok(s, q->conn))
        return fail(q->conn, 401, NULL, "invalid_api_key", "a valid API key is needed: Authorization: Bearer KEY");
    if (strcmp(method, ROUTES[path].method) != 0) {
        char msg[128];
        snprintf(msg, sizeof msg, "%s takes %s, not %.20s", url, ROUTES[path].method, method);
        api_error_t err;
        api_fail(&err, 405, NULL, "method_not_allowed", "%s", msg);
        char *j = api_error_json(&err);
        struct MHD_Response *r = j ? MHD_create_response_from_buffer(strlen(j), j, MHD_RESPMEM_MUST_FREE) : NULL;
        if (!r) {
            free(j);
            return MHD_NO;
        }
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
        MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, ROUTES[path].method);
        enum MHD_Result rc = MHD_queue_response(q->conn, 405, r);
        MHD_destroy_response(r);
        return rc;
    }
    q->route = ROUTES[path].route;
    const char *cl = MHD_lookup_connection_value(q->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (cl && strtoull(cl, NULL, 10) > s->cfg.max_body_bytes) {
        char msg[160];
        snprintf(msg, sizeof msg, "the body is %.30s bytes, more than the limit of %zu (--max-body-bytes)", cl,
                 s->cfg.max_body_bytes);
        return fail(q->conn, 413, NULL, "request_too_large", msg);
    }
    *answered = 0;
    return MHD_YES;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_size, void **con_cls) {
    http_server_t *s = cls;
    request_t *q = *con_cls;
    (void)version;
    if (!q) {
        if (!(q = calloc(1, sizeof *q))) return MHD_NO;
        q->srv = s;
        q->conn = conn;
        *con_cls = q;
        __atomic_add_fetch(&s->active, 1, __ATOMIC_SEQ_CST);
        int answered;
        enum MHD_Result rc = first_call(s, q, url, method, &answered);
        if (answered || rc != MHD_YES) return rc;
        if (q->route != ROUTE_COMPLETIONS && q->route != ROUTE_CHAT) {
            return q->route == ROUTE_MODELS ? models(q) : q->route == ROUTE_HEALTH ? health(q) : metrics(q);
        }
        return MHD_YES;  // the body comes next
    }
    if (*upload_size) {
        // Past the limit nothing more is kept: the rest is read and dropped, and the answer is a 413.
        if (!q->too_large && q->body.len + *upload_size <= s->cfg.max_body_bytes) {
            if (tok_bytes_append(&q->body, upload_data, *upload_size)) return MHD_NO;
        } else {
            q->too_large = 1;
        }
        *upload_size = 0;
        return MHD_YES;
    }
    if (q->job) return MHD_YES;  // answered already (a repeated final call)
    if (q->too_large) {
        char msg[128];
        snprintf(msg, sizeof msg, "the body is more than the limit of %zu bytes (--max-body-bytes)",
                 s->cfg.max_body_bytes);
        return fail(conn, 413, NULL, "request_too_large", msg);
    }
    return generate(q);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls, enum MHD_RequestTerminationCode toe) {
    http_server_t *s = cls;
    request_t *q = *con_cls;
    (void)conn;
    if (!q) return;
    if (q->job) {
        // Finished or not, nothing more will be read from it: an unfinished one is aborted.
        if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK) serve_engine_abort(s->cfg.engine, q->job);
        serve_job_release(q->job);
    }
    tok_bytes_free(&q->body);
    tok_bytes_free(&q->out);
    tok_bytes_free(&q->text);
    for (int i = 0; i < q->num_choices; i++) stop_text_free(&q->choices[i].dec);
    free(q->choices);
    free(q);
    *con_cls = NULL;
    __atomic_sub_fetch(&s->active, 1, __ATOMIC_SEQ_CST);
}

// ---- the server ------------------------------------------------------------------------------------

int http_server_start(const http_config_t *cfg, http_server_t **out) {
    *out = NULL;
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    int gai = getaddrinfo(cfg->host, NULL, &hints, &ai);
    if (gai || !ai) return mv_error("serve: --host %s: %s", cfg->host, gai ? gai_strerror(gai) : "no IPv4 address");
    struct sockaddr_in addr;
    memcpy(&addr, ai->ai_addr, sizeof addr);
    freeaddrinfo(ai);
    addr.sin_port = htons((uint16_t)cfg->port);
    http_server_t *s = calloc(1, sizeof *s);
    if (!s) return mv_error("serve: out of memory");
    s->cfg = *cfg;
    // A thread per connection: handlers and content readers may block on
    // their job. ITC: so that MHD_quiesce_daemon can stop the listening.
    const unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_ITC;
    s->daemon = MHD_start_daemon(flags, 0, NULL, NULL, on_request, s, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr,
                                 MHD_OPTION_CONNECTION_TIMEOUT, cfg->timeout_s, MHD_OPTION_NOTIFY_COMPLETED,
                                 on_completed, s, MHD_OPTION_END);
    if (!s->daemon) {
        free(s);
        return mv_error("serve: cannot listen on %s:%d (the port in use, or the address not this machine's?)",
                        cfg->host, cfg->port);
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->daemon, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : cfg->port;
    *out = s;
    return 0;
}

int http_server_port(const http_server_t *h) { return h->port; }

void http_server_quiesce(http_server_t *h) {
    MHD_socket fd = MHD_quiesce_daemon(h->daemon);
    if (fd != MHD_INVALID_SOCKET) close(fd);
}

int http_server_active(const http_server_t *h) { return __atomic_load_n(&h->active, __ATOMIC_SEQ_CST); }

void http_server_stop(http_server_t *h) {
    if (!h) return;
    MHD_stop_daemon(h->daemon);
    free(h);
}
