/*
 * chapters/09-engine/cmd_inspect.c - the `minivllm inspect` command: load a
 * Hugging Face model directory the way the engine will (config.json,
 * generation_config.json, the safetensors weights), check all of it, and
 * print what was found:
 *
 *   minivllm inspect --model DIR
 *
 * On any validation error it prints the error, which names the file and the
 * key or tensor, and exits 1 (after the config summary when only the
 * weights are at fault). Nothing is copied or converted: the weights
 * stay in their read-only mappings, so inspecting a multi-gigabyte
 * checkpoint reads only its headers.
 */
#include <stdio.h>

#include "chapters/09-engine/cli/cli.h"
#include "chapters/09-engine/model/model_config.h"
#include "chapters/09-engine/model/qwen3_weights.h"
#include "chapters/09-engine/model/safetensors.h"
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

static const char INSPECT_USAGE[] =
    "usage: minivllm inspect --model DIR\n"
    "\n"
    "Load and check a Hugging Face Qwen3 model directory: config.json,\n"
    "generation_config.json, and model.safetensors or the shards listed in\n"
    "model.safetensors.index.json. Prints the configuration and the tensors'\n"
    "count, dtypes and bytes; on a missing, extra or mis-shaped tensor, a\n"
    "damaged file or a bad config value, prints an error naming the file and\n"
    "the tensor or key, and exits 1.";

int cmd_inspect(int argc, char **argv) {
    const char *model = NULL;
    cli_opt_t opts[] = {
        {"--model", "DIR", "Hugging Face model directory (config.json, *.safetensors)", &model, NULL},
    };
    int st = cli_parse("inspect", INSPECT_USAGE, opts, 1, argc, argv);
    if (st == CLI_HELP) return CLI_OK;
    if (st != CLI_OK) return st;
    if (!model) return cli_error("inspect", CLI_USAGE, "--model DIR is required");

    qwen3_config_t c;
    if (qwen3_config_load(model, &c)) return cli_error("inspect", CLI_FAIL, "%s", mv_last_error());
    // The config first: it is useful on its own, e.g. for a directory
    // without weights such as the lab's shared qwen3-0.6b.
    print_config(model, &c);
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
