/*
 * tests/test_inspect_tree.c - `minivllm inspect --tree` prints Qwen3's module
 * tree as PyTorch's print(model) shows nano-vllm's Qwen3ForCausalLM, with the
 * shapes the engine uses: from a checkpoint's tensors (tests/data/tiny-qwen3-*)
 * and from config.json alone (tests/data/qwen3-0.6b-shape, the real
 * Qwen3-0.6B config without weights), where the merged qkv_proj must be
 * [4096, 1024] and gate_up_proj [6144, 1024].
 *
 * Run: make test  (build/minivllm comes from the same build directory)
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/helpers.h"

static char out[1 << 16];

static int inspect_tree(const char *dir) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "./%s/minivllm inspect --model %s --tree 2>&1", MV_BUILD_DIR, dir);
    return run_command(cmd, out, sizeof out);
}

// The line of the tree that names module `key` ("(qkv_proj): ..."), copied
// into line; fails the test when there is none.
static const char *tree_line_of(const char *key, char *line, size_t cap) {
    char needle[96];
    snprintf(needle, sizeof needle, "(%s): ", key);
    const char *p = strstr(out, needle);
    cr_assert_not_null(p, "no line for module %s in:\n%s", key, out);
    while (p > out && p[-1] != '\n') p--;
    size_t n = strcspn(p, "\n");
    if (n >= cap) n = cap - 1;
    memcpy(line, p, n);
    line[n] = '\0';
    return line;
}

// Module `key` has `shape` and `params` (as printed, with commas) on its line.
static void expect_module(const char *key, const char *cls, const char *shape, const char *params) {
    char line[512];
    tree_line_of(key, line, sizeof line);
    cr_expect(strstr(line, cls) != NULL, "%s: expected class %s in: %s", key, cls, line);
    if (shape) cr_expect(strstr(line, shape) != NULL, "%s: expected shape %s in: %s", key, shape, line);
    if (params) cr_expect(strstr(line, params) != NULL, "%s: expected %s parameters in: %s", key, params, line);
}

// Every module of the tree, in print(model)'s order.
static void expect_every_module_in_order(void) {
    static const char *ORDER[] = {"Qwen3ForCausalLM(", "(model): Qwen3Model(", "(embed_tokens): ",
                                  "(layers): ModuleList(", "Qwen3DecoderLayer(", "(self_attn): Qwen3Attention(",
                                  "(qkv_proj): ", "(o_proj): ", "(rotary_emb): ", "(attn): ", "(q_norm): ",
                                  "(k_norm): ", "(mlp): Qwen3MLP(", "(gate_up_proj): ", "(down_proj): ",
                                  "(act_fn): SiluAndMul", "(input_layernorm): ", "(post_attention_layernorm): ",
                                  "(norm): RMSNorm", "(lm_head): ParallelLMHead"};
    const char *p = out;
    for (size_t i = 0; i < sizeof ORDER / sizeof ORDER[0]; i++) {
        const char *q = strstr(p, ORDER[i]);
        cr_assert_not_null(q, "'%s' missing or out of order in:\n%s", ORDER[i], out);
        p = q + strlen(ORDER[i]);
    }
}

Test(inspect_tree, real_qwen3_0_6b_config_without_weights) {
    cr_assert_eq(inspect_tree("tests/data/qwen3-0.6b-shape"), 0, "%s", out);
    expect_every_module_in_order();
    cr_expect(strstr(out, "none in this directory") != NULL, "should say the shapes come from the config:\n%s", out);
    cr_expect(strstr(out, "(0-27): 28 x Qwen3DecoderLayer(") != NULL, "%s", out);
    expect_module("embed_tokens", "VocabParallelEmbedding", "[151936, 1024]", "155,582,464");
    // The merged matrices the engine builds: q 16 x 128 + k 8 x 128 + v 8 x 128 rows; gate and up 3072 each.
    expect_module("qkv_proj", "QKVParallelLinear", "[4096, 1024]", "4,194,304");
    cr_expect(strstr(out, "q_proj [2048, 1024] | k_proj [1024, 1024] | v_proj [1024, 1024]") != NULL, "%s", out);
    expect_module("o_proj", "RowParallelLinear", "[1024, 2048]", "2,097,152");
    expect_module("q_norm", "RMSNorm", "[128]", "128");
    expect_module("gate_up_proj", "MergedColumnParallelLinear", "[6144, 1024]", "6,291,456");
    cr_expect(strstr(out, "gate_proj [3072, 1024] | up_proj [3072, 1024]") != NULL, "%s", out);
    expect_module("down_proj", "RowParallelLinear", "[1024, 3072]", "3,145,728");
    expect_module("input_layernorm", "RMSNorm", "[1024]", "1,024");
    expect_module("norm", "RMSNorm", "[1024]", "1,024");
    cr_expect(strstr(out, "cos/sin cache [40960, 128] F32") != NULL, "%s", out);
    // Tied: lm_head has the embedding's shape and no parameters of its own.
    expect_module("lm_head", "ParallelLMHead", "[151936, 1024]", NULL);
    cr_expect(strstr(out, "tied: the same tensor as embed_tokens") != NULL, "%s", out);
    // 155,582,464 + 28 x 15,730,944 + 1,024, the same as config.json implies.
    cr_expect(strstr(out, "(0-27): 28 x Qwen3DecoderLayer(") != NULL && strstr(out, "15,730,944") != NULL, "%s", out);
    cr_expect(strstr(out, "parameters       596,049,920 (1.192 GB in bf16); config.json implies 596,049,920") != NULL,
              "%s", out);
    // Where the lab implements each module.
    cr_expect(strstr(out, "kernels/rope.cu") && strstr(out, "kernels/attention.cu") &&
                  strstr(out, "kernels/activation.cu") && strstr(out, "model/qwen3_layout.c"),
              "%s", out);
}

Test(inspect_tree, tiny_tied_checkpoint) {
    // hidden 96, 4 query heads and 2 KV heads of 64, intermediate 160, vocab 512, 2 layers, tied.
    cr_assert_eq(inspect_tree("tests/data/tiny-qwen3-tied"), 0, "%s", out);
    expect_every_module_in_order();
    cr_expect(strstr(out, "model.safetensors (1 file): shapes and dtypes of its tensors") != NULL, "%s", out);
    cr_expect(strstr(out, "(0-1): 2 x Qwen3DecoderLayer(") != NULL, "%s", out);
    expect_module("embed_tokens", "VocabParallelEmbedding", "[512, 96]", "49,152");
    expect_module("qkv_proj", "QKVParallelLinear", "[512, 96]", "49,152");
    cr_expect(strstr(out, "q_proj [256, 96] | k_proj [128, 96] | v_proj [128, 96]") != NULL, "%s", out);
    expect_module("o_proj", "RowParallelLinear", "[96, 256]", "24,576");
    expect_module("gate_up_proj", "MergedColumnParallelLinear", "[320, 96]", "30,720");
    expect_module("down_proj", "RowParallelLinear", "[96, 160]", "15,360");
    expect_module("k_norm", "RMSNorm", "[64]", "64");
    char line[512];
    cr_expect(strstr(tree_line_of("qkv_proj", line, sizeof line), "BF16") != NULL, "dtype: %s", line);
    cr_expect(strstr(out, "tied: the same tensor as embed_tokens") != NULL, "%s", out);
    // layer: 49,152 + 24,576 + 128 + 30,720 + 15,360 + 192 = 120,128; 49,152 + 2 x 120,128 + 96.
    cr_expect(strstr(out, "120,128") != NULL, "%s", out);
    cr_expect(strstr(out, "parameters       289,504 (0.001 GB in bf16); the checkpoint's tensors hold 289,504") != NULL,
              "%s", out);
}

Test(inspect_tree, untied_checkpoint_counts_lm_head) {
    cr_assert_eq(inspect_tree("tests/data/tiny-qwen3-untied"), 0, "%s", out);
    expect_every_module_in_order();
    char line[512];
    tree_line_of("lm_head", line, sizeof line);
    cr_expect(strstr(out, "tied: the same tensor") == NULL, "an untied lm_head is its own tensor:\n%s", out);
    // Its own parameters: as many as the embedding's.
    char embed[512];
    tree_line_of("embed_tokens", embed, sizeof embed);
    const char *shape = strchr(embed, '[');
    cr_assert_not_null(shape, "%s", embed);
    char want[64];
    size_t n = strcspn(shape, "]") + 1;
    snprintf(want, sizeof want, "%.*s", (int)n, shape);
    cr_expect(strstr(line, want) != NULL, "lm_head %s should have the embedding's shape %s", line, want);
}

Test(inspect_tree, bad_directory_fails_naming_it) {
    cr_expect_eq(inspect_tree("/no/such/model/dir"), 1, "%s", out);
    cr_expect(strstr(out, "/no/such/model/dir") != NULL, "%s", out);
}

// Without --tree, inspect also prints what a load would need (the estimate
// every loading command checks first) and refuses, exit 1 and both byte
// counts, when the engine options ask for more host memory than there is.
Test(inspect_memory, estimate_printed_and_an_impossible_load_refused) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "./%s/minivllm inspect --model tests/data/tiny-qwen3-tied --device cpu 2>&1",
             MV_BUILD_DIR);
    cr_assert_eq(run_command(cmd, out, sizeof out), 0, "%s", out);
    cr_expect(strstr(out, "memory           cpu: at least ") && strstr(out, "bytes of host memory to load"),
              "no memory line:\n%s", out);
    // 16M tokens a step: about a TiB of activations for Qwen3-0.6B's shapes.
    snprintf(cmd, sizeof cmd,
             "./%s/minivllm inspect --model tests/data/qwen3-0.6b-shape --device cpu "
             "--max-num-batched-tokens 16777216 2>&1",
             MV_BUILD_DIR);
    cr_assert_eq(run_command(cmd, out, sizeof out), 1, "%s", out);
    cr_expect(strstr(out, "needs at least ") && strstr(out, "are available") && strstr(out, "refused before allocating"),
              "no refusal with the numbers:\n%s", out);
}

// --model given a Hub repo id: found in the local Hugging Face cache (refs/main
// names the snapshot), and otherwise refused with the download command.
Test(model_repo_id, found_in_the_hub_cache_or_the_download_command) {
    char home[] = "/tmp/mv-hfhome-XXXXXX", cmd[2048], cwd[1024];
    cr_assert_not_null(mkdtemp(home));
    cr_assert_not_null(getcwd(cwd, sizeof cwd));
    snprintf(cmd, sizeof cmd,
             "mkdir -p %s/hub/models--Org--tiny/refs %s/hub/models--Org--tiny/snapshots && "
             "printf 'deadbeef\\n' > %s/hub/models--Org--tiny/refs/main && "
             "ln -s %s/tests/data/tiny-qwen3-tied %s/hub/models--Org--tiny/snapshots/deadbeef",
             home, home, home, cwd, home);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
    snprintf(cmd, sizeof cmd, "HF_HOME=%s HF_HUB_CACHE= ./%s/minivllm inspect --model Org/tiny --device cpu 2>&1", home,
             MV_BUILD_DIR);
    const int st = run_command(cmd, out, sizeof out);
    cr_expect_eq(st, 0, "%s", out);
    cr_expect(strstr(out, "the Hugging Face cache's copy") && strstr(out, "snapshots/deadbeef"), "%s", out);
    cr_expect(strstr(out, "tensors          24: 24 BF16"), "the snapshot was not loaded:\n%s", out);
    snprintf(cmd, sizeof cmd, "HF_HOME=%s HF_HUB_CACHE= ./%s/minivllm inspect --model Org/absent 2>&1", home,
             MV_BUILD_DIR);
    cr_expect_eq(run_command(cmd, out, sizeof out), 1, "%s", out);
    cr_expect(strstr(out, "hf download Org/absent --local-dir models/absent"), "no download command:\n%s", out);
    snprintf(cmd, sizeof cmd, "rm -rf %s", home);
    cr_expect_eq(system(cmd), 0);
}
