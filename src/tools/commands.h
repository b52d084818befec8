/* commands.h — the table of moeserve subcommands.  Each entry's function takes
 * (argc, argv) with argv[0] = the command name and returns the exit status.
 * Add a line here when a command's file lands. */
#ifndef MS_TOOLS_COMMANDS_H
#define MS_TOOLS_COMMANDS_H

int ms_cmd_bench(int argc, char **argv);
int ms_cmd_generate(int argc, char **argv);
int ms_cmd_mkmodel(int argc, char **argv);
int ms_cmd_plan(int argc, char **argv);
int ms_cmd_serve(int argc, char **argv);
int ms_cmd_simulate(int argc, char **argv);
int ms_cmd_version(int argc, char **argv);
int ms_cmd_comm_check(int argc, char **argv);
int ms_cmd_eplb(int argc, char **argv);
int ms_cmd_perplexity(int argc, char **argv);
int ms_cmd_tokenizer(int argc, char **argv);

#define MS_COMMANDS(X)                                                                             \
    X("bench", ms_cmd_bench, "serving benchmark client (TTFT, ITL, TPOT, throughput, goodput)")    \
    X("comm-check", ms_cmd_comm_check, "check and measure MPI communication (--np N --mode ...)")  \
    X("eplb", ms_cmd_eplb, "DeepSeek's expert load balancer on recorded loads (phy2log, log2phy)") \
    X("generate", ms_cmd_generate, "run prompts through a model and print the continuation")       \
    X("mkmodel", ms_cmd_mkmodel, "write a seeded random checkpoint (tests, benchmarks)")           \
    X("perplexity", ms_cmd_perplexity,                                                             \
      "perplexity, bits per byte, KL divergence of a model on a text")                             \
    X("plan", ms_cmd_plan, "resolve a launch shape: layout, memory, KV capacity, traffic")         \
    X("serve", ms_cmd_serve, "OpenAI-compatible HTTP server (SGLang flags, endpoints, metrics)")   \
    X("simulate", ms_cmd_simulate, "DP admission policies on a synthetic workload (no model)")     \
    X("tokenizer", ms_cmd_tokenizer, "train a byte-level BPE tokenizer on files, or encode files") \
    X("version", ms_cmd_version, "print the version and the CPU features in use")

#endif
