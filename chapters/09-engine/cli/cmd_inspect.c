/*
 * chapters/09-engine/cmd_inspect.c - the `minivllm inspect` command: load a
 * Hugging Face model directory the way the engine will (config.json,
 * generation_config.json, the safetensors weights), check all of it, and
 * print what was found:
 *
 *   minivllm inspect --model DIR
 *   minivllm inspect --model DIR --tree
 *
 * --tree prints the model as a tree of modules, the way PyTorch's
 * print(model) shows nano-vllm's Qwen3ForCausalLM, with each module's
 * weight shape, dtype and parameter count, and the lab's kernel and file
 * that run it. Its shapes come from the checkpoint's tensors when the
 * directory has weights, and from config.json alone when it has none (the
 * lab's shared qwen3-0.6b folder holds only the config and tokenizer).
 * The merged matrices (qkv_proj, gate_up_proj) are the engine's, built by
 * model/qwen3_layout.c from the checkpoint's separate q/k/v and gate/up.
 *
 * On any validation error it prints the error, which names the file and the
 * key or tensor, and exits 1 (after the config summary when only the
 * weights are at fault). Nothing is copied or converted: the weights
 * stay in their read-only mappings, so inspecting a multi-gigabyte
 * checkpoint reads only its headers.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "chapters/09-engine/cli/cli.h"
#include "chapters/09-engine/model/model_config.h"
#include "chapters/09-engine/model/qwen3_layout.h"
#include "chapters/09-engine/model/qwen3_weights.h"
#include "chapters/09-engine/model/safetensors.h"
#include "chapters/09-engine/runtime/engine.h"
#include "common/check.h"

static void print_config(const char *dir, const qwen3_config_t *c) {
    printf("model            %s\n", dir);
    printf("architecture     %s (saved as %s)\n", c->architecture, c->dtype);
    printf("layers           %d\n", c->num_hidden_layers);
    printf("hidden_size      %d\n", c->hidden_size);
    printf("intermediate     %d\n", c->intermediate_size);
    printf("vocab_size       %d\n", c->vocab_size);
    printf("heads            %d query, %d key/value (%d queries per KV head), head_dim %d\n", c->num_attention_heads,
           c->num_key_value_heads, c->num_attention_heads / c->num_key_value_heads, c->head_dim);
    printf("rope             theta %g, scaling %s", c->rope_theta, rope_scaling_name(c->rope_scaling.kind));
    if (c->rope_scaling.kind == QWEN3_ROPE_LLAMA3)
        printf(" (factor %g, low_freq_factor %g, high_freq_factor %g, original_max_position_embeddings %d)",
               c->rope_scaling.factor, c->rope_scaling.low_freq_factor, c->rope_scaling.high_freq_factor,
               c->rope_scaling.original_max_position_embeddings);
    printf("\nmax_positions    %d\n", c->max_position_embeddings);
    printf("rms_norm_eps     %g\n", c->rms_norm_eps);
    printf("tied embeddings  %s\n", c->tie_word_embeddings ? "yes" : "no");
    printf("attention bias   %s\n", c->attention_bias ? "yes" : "no");
    printf("eos ids          [");
    for (int i = 0; i < c->n_eos; i++) printf(i ? ", %d" : "%d", c->eos_token_ids[i]);
    printf("], bos id %d\n", c->bos_token_id);
    printf("sampling         temperature %g, top_k %d%s, top_p %g\n", c->temperature, c->top_k,
           c->top_k ? "" : " (off)", c->top_p);
}

static void print_weights(const st_model_t *m, const qwen3_weights_t *w) {
    size_t count[3] = {0}, bytes = 0;
    for (size_t i = 0; i < m->n_tensors; i++) {
        count[m->tensors[i].dtype]++;
        bytes += m->tensors[i].nbytes;
    }
    printf("weights          %s (%d file%s)\n", m->source, m->n_files, m->n_files == 1 ? "" : "s");
    printf("tensors          %zu: %zu BF16, %zu F16, %zu F32\n", m->n_tensors, count[ST_BF16], count[ST_F16],
           count[ST_F32]);
    printf("tensor bytes     %zu (%.3f GB as stored)\n", bytes, (double)bytes / 1e9);
    // bf16 is what the engine keeps: 2 bytes per parameter used.
    printf("parameters       %lld used (%.3f GB in bf16)\n", (long long)w->n_params, 2.0 * (double)w->n_params / 1e9);
}

// ---- --tree: the module tree ---------------------------------------------------

// One weight as the tree shows it: a shape of up to two dims and a dtype.
typedef struct {
    int ndim;          // 0: the module has no weight
    int64_t dim[2];    // [out, in] for a matrix, [n] for a norm
    const char *dtype; // "BF16", "F16", "F32": the checkpoint's spelling
} tree_weight_t;

static int64_t tree_numel(tree_weight_t t) {
    if (t.ndim == 0) return 0;
    return t.ndim == 1 ? t.dim[0] : t.dim[0] * t.dim[1];
}

static tree_weight_t weight_of_tensor(const st_tensor_t *t) {
    tree_weight_t w = {t->ndim, {t->shape[0], t->ndim > 1 ? t->shape[1] : 0}, st_dtype_name(t->dtype)};
    return w;
}

static tree_weight_t weight_of_dims(int ndim, int64_t d0, int64_t d1, const char *dtype) {
    tree_weight_t w = {ndim, {d0, d1}, dtype};
    return w;
}

// config.json's torch_dtype in the safetensors spelling, so that a tree
// from the config reads like one from a checkpoint.
static const char *config_dtype(const qwen3_config_t *c) {
    if (!strcmp(c->dtype, "float16")) return "F16";
    if (!strcmp(c->dtype, "float32")) return "F32";
    return "BF16";
}

// 155582464 -> "155,582,464"
static const char *with_commas(int64_t v, char *buf, size_t cap) {
    char digits[32];
    int n = snprintf(digits, sizeof digits, "%" PRId64, v), o = 0;
    for (int i = 0; i < n && o + 2 < (int)cap; i++) {
        if (i > 0 && (n - i) % 3 == 0) buf[o++] = ',';
        buf[o++] = digits[i];
    }
    buf[o] = '\0';
    return buf;
}

static void shape_text(tree_weight_t w, char *buf, size_t cap) {
    if (w.ndim == 0)
        snprintf(buf, cap, "-");
    else if (w.ndim == 1)
        snprintf(buf, cap, "[%" PRId64 "]", w.dim[0]);
    else
        snprintf(buf, cap, "[%" PRId64 ", %" PRId64 "]", w.dim[0], w.dim[1]);
}

// One line of the tree: "(key): Class" indented by depth, then the weight's
// shape, dtype and parameters, then where the lab implements it. `opens`
// ends the name with "(" as print(model) does for a module with children.
enum { TREE_NAME_W = 56 };
static void tree_line(int depth, const char *key, const char *cls, int opens, tree_weight_t w, int64_t params,
                      const char *lab) {
    char name[160], shape[48], count[32];
    snprintf(name, sizeof name, "%*s%s%s%s%s%s", 2 * depth, "", key ? "(" : "", key ? key : "", key ? "): " : "",
             cls, opens ? "(" : "");
    shape_text(w, shape, sizeof shape);
    if (params > 0)
        with_commas(params, count, sizeof count);
    else
        snprintf(count, sizeof count, "-");
    printf("%-*s %-15s %-5s %13s%s%s\n", TREE_NAME_W, name, shape, w.ndim ? w.dtype : "-", count, lab ? "  " : "",
           lab ? lab : "");
}

// A continuation line under a module: its pieces, or a note.
static void tree_note(const char *fmt_text) {
    printf("%-*s   %s\n", TREE_NAME_W, "", fmt_text);
}

static void tree_close(int depth) { printf("%*s)\n", 2 * depth, ""); }

// The weights of one decoder layer, as the tree shows them: from the
// checkpoint's layer 0 (qwen3_weights_bind has checked that every layer
// has the same shapes), or from the config.
typedef struct {
    tree_weight_t q, k, v, o, q_norm, k_norm, gate, up, down, in_norm, post_norm;
    tree_weight_t q_bias, k_bias, v_bias, o_bias;  // ndim 0 without attention_bias
} tree_layer_t;

static void layer_from_config(const qwen3_config_t *c, tree_layer_t *L) {
    const char *dt = config_dtype(c);
    int64_t H = c->hidden_size, I = c->intermediate_size, hd = c->head_dim;
    int64_t q = (int64_t)c->num_attention_heads * hd, kv = (int64_t)c->num_key_value_heads * hd;
    memset(L, 0, sizeof *L);
    L->q = weight_of_dims(2, q, H, dt);
    L->k = weight_of_dims(2, kv, H, dt);
    L->v = weight_of_dims(2, kv, H, dt);
    L->o = weight_of_dims(2, H, q, dt);
    L->q_norm = L->k_norm = weight_of_dims(1, hd, 0, dt);
    L->gate = L->up = weight_of_dims(2, I, H, dt);
    L->down = weight_of_dims(2, H, I, dt);
    L->in_norm = L->post_norm = weight_of_dims(1, H, 0, dt);
    if (c->attention_bias) {
        L->q_bias = weight_of_dims(1, q, 0, dt);
        L->k_bias = L->v_bias = weight_of_dims(1, kv, 0, dt);
        L->o_bias = weight_of_dims(1, H, 0, dt);
    }
}

static void layer_from_checkpoint(const qwen3_layer_weights_t *lw, tree_layer_t *L) {
    memset(L, 0, sizeof *L);
    L->q = weight_of_tensor(lw->q_proj);
    L->k = weight_of_tensor(lw->k_proj);
    L->v = weight_of_tensor(lw->v_proj);
    L->o = weight_of_tensor(lw->o_proj);
    L->q_norm = weight_of_tensor(lw->q_norm);
    L->k_norm = weight_of_tensor(lw->k_norm);
    L->gate = weight_of_tensor(lw->gate_proj);
    L->up = weight_of_tensor(lw->up_proj);
    L->down = weight_of_tensor(lw->down_proj);
    L->in_norm = weight_of_tensor(lw->input_layernorm);
    L->post_norm = weight_of_tensor(lw->post_attention_layernorm);
    if (lw->q_bias) {
        L->q_bias = weight_of_tensor(lw->q_bias);
        L->k_bias = weight_of_tensor(lw->k_bias);
        L->v_bias = weight_of_tensor(lw->v_bias);
        L->o_bias = weight_of_tensor(lw->o_bias);
    }
}

// Print the tree; returns the parameters it counted (each distinct tensor
// once: a tied lm_head adds nothing).
static int64_t print_tree(const qwen3_config_t *c, const qwen3_layout_t *lo, tree_weight_t embed, tree_weight_t norm,
                          tree_weight_t lm_head, const tree_layer_t *L) {
    char buf[256], a[48], b[48], d[48];
    const int n_layers = c->num_hidden_layers;
    const int64_t qkv_params = tree_numel(L->q) + tree_numel(L->k) + tree_numel(L->v);
    const int64_t qkv_bias = tree_numel(L->q_bias) + tree_numel(L->k_bias) + tree_numel(L->v_bias);
    const int64_t gate_up_params = tree_numel(L->gate) + tree_numel(L->up);
    const int64_t attn_params = qkv_params + qkv_bias + tree_numel(L->o) + tree_numel(L->o_bias) +
                                tree_numel(L->q_norm) + tree_numel(L->k_norm);
    const int64_t mlp_params = gate_up_params + tree_numel(L->down);
    const int64_t layer_params = attn_params + mlp_params + tree_numel(L->in_norm) + tree_numel(L->post_norm);
    const int64_t lm_params = c->tie_word_embeddings ? 0 : tree_numel(lm_head);
    const int64_t total = tree_numel(embed) + n_layers * layer_params + tree_numel(norm) + lm_params;
    const tree_weight_t none = {0, {0, 0}, NULL};
    // The merged matrices the engine builds (qwen3_layout.c, tp_size 1).
    const tree_weight_t qkv = weight_of_dims(2, lo->qkv.rows, lo->qkv.cols, L->q.dtype);
    const tree_weight_t gate_up = weight_of_dims(2, lo->gate_up.rows, lo->gate_up.cols, L->gate.dtype);

    printf("%-*s %-15s %-5s %13s  %s\n", TREE_NAME_W, "module (PyTorch's print(model), as nano-vllm builds it)",
           "weight", "dtype", "parameters", "in the lab");
    tree_line(0, NULL, "Qwen3ForCausalLM", 1, none, total, "chapters/09-engine (build/minivllm)");
    tree_line(1, "model", "Qwen3Model", 1, none, total - lm_params,
              "the forward pass: runtime/runner_cuda.c, runtime/runner_cpu.c");
    tree_line(2, "embed_tokens", "VocabParallelEmbedding", 0, embed, tree_numel(embed),
              "ch04 embedding_cuda, kernels/embedding.cu");
    tree_line(2, "layers", "ModuleList", 1, none, n_layers * layer_params, "one loop over the layers");
    snprintf(buf, sizeof buf, "(0-%d): %d x Qwen3DecoderLayer", n_layers - 1, n_layers);
    tree_line(3, NULL, buf, 1, none, layer_params, "per layer: cuda_layer, cpu_layer");
    tree_line(4, "self_attn", "Qwen3Attention", 1, none, attn_params, NULL);
    tree_line(5, "qkv_proj", "QKVParallelLinear", 0, qkv, qkv_params, "ch03 linear_cuda, kernels/linear.cu");
    shape_text(L->q, a, sizeof a);
    shape_text(L->k, b, sizeof b);
    shape_text(L->v, d, sizeof d);
    snprintf(buf, sizeof buf, "= rows of q_proj %s | k_proj %s | v_proj %s, stacked by model/qwen3_layout.c", a, b, d);
    tree_note(buf);
    if (qkv_bias) {
        snprintf(buf, sizeof buf, "+ bias [%" PRId64 "]: %s parameters (attention_bias)", qkv_bias,
                 with_commas(qkv_bias, a, sizeof a));
        tree_note(buf);
    }
    tree_line(5, "o_proj", "RowParallelLinear", 0, L->o, tree_numel(L->o) + tree_numel(L->o_bias),
              "ch03 linear_cuda, kernels/linear.cu");
    if (L->o_bias.ndim) {
        shape_text(L->o_bias, a, sizeof a);
        snprintf(buf, sizeof buf, "+ bias %s (attention_bias)", a);
        tree_note(buf);
    }
    snprintf(buf, sizeof buf, "cos/sin cache [%d, %d] F32 (computed, not a parameter)", c->max_position_embeddings,
             c->head_dim);
    tree_line(5, "rotary_emb", "RotaryEmbedding", 0, none, 0, "ch05 qk_norm_rope_cuda, kernels/rope.cu");
    tree_note(buf);
    tree_line(5, "attn", "Attention", 0, none, 0, "ch06 store_kvcache_cuda, kernels/kv_store.cu;");
    tree_note("ch07 attention_prefill_cuda, attention_decode_cuda, kernels/attention.cu");
    snprintf(buf, sizeof buf, "%d query heads, %d KV heads, head_dim %d; K/V cache [blocks, block_size, %d, %d] each",
             c->num_attention_heads, c->num_key_value_heads, c->head_dim, c->num_key_value_heads, c->head_dim);
    tree_note(buf);
    tree_line(5, "q_norm", "RMSNorm", 0, L->q_norm, tree_numel(L->q_norm), "ch02 rule, fused into ch05 qk_norm_rope_cuda");
    tree_line(5, "k_norm", "RMSNorm", 0, L->k_norm, tree_numel(L->k_norm), "ch02 rule, fused into ch05 qk_norm_rope_cuda");
    tree_close(4);
    tree_line(4, "mlp", "Qwen3MLP", 1, none, mlp_params, NULL);
    tree_line(5, "gate_up_proj", "MergedColumnParallelLinear", 0, gate_up, gate_up_params,
              "ch03 linear_cuda, kernels/linear.cu");
    shape_text(L->gate, a, sizeof a);
    shape_text(L->up, b, sizeof b);
    snprintf(buf, sizeof buf, "= rows of gate_proj %s | up_proj %s, stacked by model/qwen3_layout.c", a, b);
    tree_note(buf);
    tree_line(5, "down_proj", "RowParallelLinear", 0, L->down, tree_numel(L->down), "ch03 linear_cuda, kernels/linear.cu");
    tree_line(5, "act_fn", "SiluAndMul", 0, none, 0, "ch01 silu_and_mul_cuda, kernels/activation.cu");
    tree_close(4);
    tree_line(4, "input_layernorm", "RMSNorm", 0, L->in_norm, tree_numel(L->in_norm),
              "ch02 fused_add_rmsnorm_cuda (layer 0: rmsnorm_cuda), kernels/rmsnorm.cu");
    tree_line(4, "post_attention_layernorm", "RMSNorm", 0, L->post_norm, tree_numel(L->post_norm),
              "ch02 fused_add_rmsnorm_cuda, kernels/rmsnorm.cu");
    tree_close(3);
    tree_close(2);
    tree_line(2, "norm", "RMSNorm", 0, norm, tree_numel(norm), "ch02 fused_add_rmsnorm_cuda, kernels/rmsnorm.cu");
    tree_close(1);
    tree_line(1, "lm_head", "ParallelLMHead", 0, lm_head, lm_params,
              "ch04 gather_last_tokens_cuda, then ch03 linear_cuda");
    if (c->tie_word_embeddings) tree_note("tied: the same tensor as embed_tokens, so no parameters of its own");
    tree_close(0);
    return total;
}

// Does the directory hold weights at all? (Which file st_open reads.)
static int has_weights(const char *dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (access(path, F_OK) == 0) return 1;
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    return access(path, F_OK) == 0;
}

static int inspect_tree(const char *model, const qwen3_config_t *c) {
    qwen3_layout_t lo;
    if (qwen3_layout_init(&lo, c, 1, 0)) return cli_error("inspect", CLI_FAIL, "%s", mv_last_error());
    char a[32], b[32];
    printf("model            %s\n", model);
    if (!has_weights(model)) {
        // Config only: every shape is what the config implies.
        const char *dt = config_dtype(c);
        tree_layer_t L;
        layer_from_config(c, &L);
        tree_weight_t embed = weight_of_dims(2, c->vocab_size, c->hidden_size, dt);
        tree_weight_t norm = weight_of_dims(1, c->hidden_size, 0, dt);
        printf("weights          none in this directory: shapes from config.json, dtype from its torch_dtype\n\n");
        int64_t total = print_tree(c, &lo, embed, norm, embed, &L);
        printf("\nparameters       %s (%.3f GB in bf16); config.json implies %s\n", with_commas(total, a, sizeof a),
               2.0 * (double)total / 1e9, with_commas(qwen3_config_n_params(c), b, sizeof b));
        return CLI_OK;
    }
    st_model_t *m = NULL;
    qwen3_weights_t w;
    if (st_open(model, &m) || qwen3_weights_bind(c, m, &w)) {
        cli_error("inspect", CLI_FAIL, "%s", mv_last_error());
        st_close(m);
        return CLI_FAIL;
    }
    tree_layer_t L;
    layer_from_checkpoint(&w.layers[0], &L);
    printf("weights          %s (%d file%s): shapes and dtypes of its tensors\n\n", m->source, m->n_files,
           m->n_files == 1 ? "" : "s");
    int64_t total = print_tree(c, &lo, weight_of_tensor(w.embed_tokens), weight_of_tensor(w.norm),
                               weight_of_tensor(w.lm_head), &L);
    printf("\nparameters       %s (%.3f GB in bf16); the checkpoint's tensors hold %s\n", with_commas(total, a, sizeof a),
           2.0 * (double)total / 1e9, with_commas(w.n_params, b, sizeof b));
    qwen3_weights_free(&w);
    st_close(m);
    return CLI_OK;
}

// What loading this model with these engine options would take, before
// anything is allocated (engine_memory_estimate, the check every loading
// command makes): printed, and CLI_FAIL with the engine's message when it
// would not fit in host memory. On cuda the GPU's share is printed too; the
// runner checks it against cudaMemGetInfo when it loads.
static int print_memory(const char *model, const qwen3_config_t *c, const cli_engine_args_t *ea) {
    engine_config_t ec = engine_config_default(model);
    int st = cli_engine_config("inspect", ea, &ec);
    if (st != CLI_OK) return st;
    engine_memory_t mem;
    size_t avail = 0;
    if (engine_config_resolve(&ec, c) || engine_memory_estimate(&ec, c, &mem) || host_memory_available(&avail))
        return cli_error("inspect", CLI_FAIL, "%s", mv_last_error());
    printf("memory           %s: at least %zu bytes of host memory to load (%.2f GiB; %.2f GiB with the whole KV "
           "cache of %d blocks), %zu available (%.2f GiB)\n",
           model_runner_device_name(ec.device), mem.host_min_bytes, (double)mem.host_min_bytes / (1 << 30),
           (double)mem.host_bytes / (1 << 30), ec.num_blocks, avail, (double)avail / (1 << 30));
    if (ec.device != RUNNER_DEVICE_CPU)
        printf("device memory    at least %zu bytes (%.2f GiB: weights, scratch%s)\n", mem.device_bytes,
               (double)mem.device_bytes / (1 << 30), ec.num_blocks ? ", KV cache" : "; the KV cache takes what is left");
    if (engine_memory_check(&mem, &ec)) return cli_error("inspect", CLI_FAIL, "%s", mv_last_error());
    return CLI_OK;
}

static const char INSPECT_USAGE[] =
    "usage: minivllm inspect --model DIR [--tree]\n"
    "\n"
    "Load and check a Hugging Face Qwen3 model directory: config.json,\n"
    "generation_config.json, and model.safetensors or the shards listed in\n"
    "model.safetensors.index.json. Prints the configuration and the tensors'\n"
    "count, dtypes and bytes; on a missing, extra or mis-shaped tensor, a\n"
    "damaged file or a bad config value, prints an error naming the file and\n"
    "the tensor or key, and exits 1.\n"
    "\n"
    "--tree prints the model's modules as PyTorch's print(model) shows\n"
    "nano-vllm's Qwen3ForCausalLM, with each weight's shape, dtype and\n"
    "parameters and the lab kernel that runs it. It needs only config.json:\n"
    "without weights in DIR, the shapes come from the config.\n"
    "\n"
    "Without --tree it also prints the memory a load would need with the\n"
    "engine options given (the same estimate generate, bench and serve check\n"
    "before they allocate) and exits 1 when it would not fit.";

int cmd_inspect(int argc, char **argv) {
    const char *model = NULL;
    int tree = 0;
    cli_engine_args_t ea = {0};
    cli_opt_t opts[2 + CLI_ENGINE_N_OPTS] = {
        {"--model", "DIR", "Hugging Face model directory (config.json, *.safetensors)", &model, NULL},
        {"--tree", NULL, "print the module tree with shapes (config.json alone is enough)", NULL, &tree},
    };
    const int n_opts = 2 + cli_engine_opts(&ea, opts + 2);
    int st = cli_parse("inspect", INSPECT_USAGE, opts, n_opts, argc, argv);
    if (st == CLI_HELP) return CLI_OK;
    if (st != CLI_OK) return st;
    if (!model) return cli_error("inspect", CLI_USAGE, "--model DIR is required");
    {
        const int mst = cli_model_dir("inspect", &model);
        if (mst != CLI_OK) return mst;
    }

    qwen3_config_t c;
    if (qwen3_config_load(model, &c)) return cli_error("inspect", CLI_FAIL, "%s", mv_last_error());
    if (tree) return inspect_tree(model, &c);
    // The config first: it is useful on its own, e.g. for a directory
    // without weights such as the lab's shared qwen3-0.6b.
    print_config(model, &c);
    if ((st = print_memory(model, &c, &ea)) != CLI_OK) return st;
    st_model_t *m = NULL;
    qwen3_weights_t w;
    if (st_open(model, &m) || qwen3_weights_bind(&c, m, &w)) {
        cli_error("inspect", CLI_FAIL, "%s", mv_last_error());
        st_close(m);
        return CLI_FAIL;
    }
    print_weights(m, &w);
    qwen3_weights_free(&w);
    st_close(m);
    return CLI_OK;
}
