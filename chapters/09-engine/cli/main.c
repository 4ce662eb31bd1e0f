/*
 * chapters/09-engine/cli/main.c - `minivllm`, the engine's command-line program.
 *
 * One program, several commands, each in its own file (cmd_*.c):
 *   minivllm tokenize   --model DIR --text "Hello"      text -> ids
 *   minivllm detokenize --model DIR --ids 9707          ids -> text
 *   minivllm inspect    --model DIR                     check and describe a model directory
 *   minivllm generate   --model DIR --prompt "Hello"    run the engine (--device cpu or cuda)
 *   minivllm bench      --model DIR --random-weights    time the engine: output and total tok/s
 *   minivllm serve      --model DIR --port 8000         an OpenAI-compatible HTTP server (serve/)
 *   minivllm chat       --model DIR                     an interactive chat, replies streamed
 * Adding a command is one line in COMMANDS below (see cli.h).
 *
 * Build and run:  make && ./build/minivllm --help   (--version: the version and the build)
 * Exit status: 0 success, 1 failure (bad input or model files, a request that
 * failed), 2 bad arguments, 130 / 143 stopped by SIGINT / SIGTERM.
 */
#include <stdio.h>
#include <string.h>

#include "chapters/09-engine/cli/cli.h"
#include "chapters/09-engine/parallel/tp_comm.h"

typedef struct {
    const char *name;
    const char *summary;
    int (*run)(int argc, char **argv);  // argv[0] is the command's name
} command_t;

static const command_t COMMANDS[] = {
    {"tokenize", "text or chat requests -> Qwen3 token ids (JSON lists)", cmd_tokenize},
    {"detokenize", "token ids -> text", cmd_detokenize},
    {"inspect", "check a model directory (config, weights) and describe it", cmd_inspect},
    {"generate", "prompts -> generated tokens with the engine (continuous batching)", cmd_generate},
    {"bench", "time the engine on random requests: output tok/s and total tok/s", cmd_bench},
    {"serve", "an OpenAI-compatible HTTP server (completions, chat, streaming)", cmd_serve},
    {"chat", "an interactive multi-turn chat at the terminal, replies streamed", cmd_chat},
};
enum { N_COMMANDS = sizeof COMMANDS / sizeof COMMANDS[0] };

static void usage(FILE *f) {
    fprintf(f, "usage: minivllm COMMAND [OPTIONS]\n\n"
               "mini-vLLM Lab's inference engine for Qwen3 (chapter 09).\n\nCommands:\n");
    for (int i = 0; i < N_COMMANDS; i++) fprintf(f, "  %-12s %s\n", COMMANDS[i].name, COMMANDS[i].summary);
    fprintf(f, "\nRun 'minivllm COMMAND --help' for a command's options, 'minivllm --version' for the build.\n");
}

// The version, then what this binary was built with: a bug report needs both.
static void version(void) {
    printf("minivllm %s (mini-vLLM Lab, chapter 09)\n", MV_VERSION);
#ifdef __clang__
    const char *cc = "";  // clang's __VERSION__ names itself
#else
    const char *cc = "gcc ";
#endif
    printf("built with CUDA: %s, NCCL: %s, MPI: %s, compiler: %s%s\n", MV_HAVE_CUDA ? "yes" : "no",
           MV_HAVE_NCCL ? "yes" : "no", MV_HAVE_MPI ? "yes" : "no", cc, __VERSION__);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
        usage(stdout);
        return 0;
    }
    if (strcmp(argv[1], "--version") == 0 || strcmp(argv[1], "version") == 0) {
        version();
        return 0;
    }
    // tp_comm_end: under mpirun (--tensor-parallel-size > 1) every rank ends
    // MPI here, cleanly, or stops the others when they may still wait on it.
    for (int i = 0; i < N_COMMANDS; i++)
        if (strcmp(argv[1], COMMANDS[i].name) == 0) return tp_comm_end(COMMANDS[i].run(argc - 1, argv + 1));
    fprintf(stderr, "minivllm: unknown %s '%s' (see minivllm --help)\n", argv[1][0] == '-' ? "option" : "command",
            argv[1]);
    return 2;
}
