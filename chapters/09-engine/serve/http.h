/*
 * chapters/09-engine/serve/http.h - the OpenAI-compatible HTTP front of `minivllm serve`.
 *
 * Where it sits: libmicrohttpd parses HTTP and runs a thread per
 * connection; http.c routes each request, reads its body (at most
 * max_body_bytes: a larger Content-Length is a 413 before any of the body
 * is read, a chunked body is cut off at the limit), parses it (openai.c),
 * hands it to the engine thread (engine_thread.c) and answers:
 *
 *   POST /v1/completions, /v1/chat/completions   one JSON body, or with "stream": true
 *                                                server-sent events, a chunk per token
 *   GET  /v1/models        the one model served
 *   GET  /health           200, or 500 once the engine has failed
 *   GET  /metrics          Prometheus text (engine_thread.c)
 *
 * Errors use OpenAI's schema {"error": {"message", "type", "param", "code"}}:
 * 400 bad body or field, 401 a missing or wrong "Authorization: Bearer KEY"
 * when an API key is set (on /v1/ paths; /health and /metrics stay open, as
 * vLLM's do), 404 unknown path or model, 405 wrong method, 413 body too
 * large, 503 queue full or shutting down, 500 the engine failed.
 *
 * A client that goes away (its socket closed while its answer is being
 * made) aborts its request: the engine frees its KV blocks before its next
 * step. A connection idle for timeout_s seconds is closed, except while the
 * engine works on its request.
 */
#ifndef MV_SERVE_HTTP_H
#define MV_SERVE_HTTP_H

#include <stddef.h>

#include "chapters/09-engine/serve/engine_thread.h"
#include "chapters/09-engine/serve/openai.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    const char *host;             // an IPv4 address or a name for one ("127.0.0.1")
    int port;                     // 0: any free port (http_server_port says which)
    const char *api_key;          // NULL: no key needed
    size_t max_body_bytes;        // a larger body is a 413
    unsigned timeout_s;           // idle connections are closed after this long (0 = never)
    int max_model_len;            // for /v1/models
    api_context_t api;            // the model, as bodies are parsed against it
    serve_engine_t *engine;
} http_config_t;

typedef struct http_server http_server_t;

// Listen and serve (libmicrohttpd's threads). -1 with mv_error() when the
// address cannot be listened on.
int http_server_start(const http_config_t *cfg, http_server_t **out);
int http_server_port(const http_server_t *h);
// Stop accepting connections (the listening socket is closed); those open go on.
void http_server_quiesce(http_server_t *h);
// Requests being answered now.
int http_server_active(const http_server_t *h);
// Close every connection and stop.
void http_server_stop(http_server_t *h);

#ifdef __cplusplus
}
#endif
#endif
