"""flag_table.py — the tests' own table of SGLang launch flags by kind (issue 23), kept
apart from the code's table (src/serve/flag_kinds.c) so that the tests check the code
against an independent statement of what each flag is.  Used by tests/flags_test.py
(every flag here, one by one) and tests/recipes_test.py (the seed recipes).

Kinds:
  IMPL      implemented: the server starts, and the flag is named in no warning
  GPU       GPU-only tuning: accepted, named in the one start-up warning line
  NOT_BUILT the feature is not built: refused, naming the flag, "not implemented"
  V4        a DeepSeek-V4 flag: refused on a V3 model, naming the flag and the model
IMPL_VALUES: more values of IMPL flags that start a server on the V3 test model (the
DeepSeek-V4 parsers: SGLang takes any parser with any model).
  MULTI     multi-node: refused with the mpirun command that does the same
Each entry: flag -> a sample value (None: a switch; a list: several values).
"""

IMPL = {
    "--tp": "1", "--dp": "1", "--enable-dp-attention": None, "--enable-dp-lm-head": None,
    "--ep-size": "1", "--moe-a2a-backend": "none", "--moe-dense-tp-size": "1",
    "--disable-shared-experts-fusion": None, "--mem-fraction-static": "0.3",
    "--chunked-prefill-size": "4096", "--max-running-requests": "16", "--page-size": "16",
    "--watchdog-timeout": "3600", "--stream-interval": "2", "--enable-cache-report": None,
    "--kv-cache-dtype": "auto", "--speculative-algorithm": "EAGLE",
    "--speculative-num-steps": "2", "--speculative-eagle-topk": "1",
    "--speculative-num-draft-tokens": "3",
    "--disaggregation-mode": "null", "--tool-call-parser": "deepseekv31",
    "--reasoning-parser": "deepseek-r1", "--deepep-max-dispatch-tokens-per-rank": "256",
    "--served-model-name": "m", "--enable-metrics": None, "--init-expert-location": "trivial",
    "--expert-distribution-recorder-mode": "stat",
    "--expert-distribution-recorder-buffer-size": "100", "--eplb-algorithm": "deepseek",
    "--enable-deterministic-inference": None,
    "--eplb-rebalance-num-iterations": "100", "--eplb-rebalance-layers-per-chunk": "2",
    "--eplb-min-rebalancing-utilization-threshold": "0.9",
}

GPU = {
    "--cuda-graph-max-bs": "256", "--cuda-graph-bs": ["1", "2", "4"],
    "--cuda-graph-bs-decode": ["1", "2", "3", "4", "5", "6", "7", "8"],
    "--disable-cuda-graph": None, "--moe-runner-backend": "flashinfer_mxfp4",
    "--attention-backend": "dsv4", "--disable-flashinfer-autotune": None,
    "--flashinfer-mxfp4-moe-precision": "fp8", "--trust-remote-code": None,
    "--deepep-mode": "auto", "--enable-dp-attention-local-control-broadcast": None,
    "--speculative-draft-attention-backend": "fa3",
    "--speculative-moe-runner-backend": "triton",
    "--disaggregation-ib-device": "mlx5_0,mlx5_1",
}

NOT_BUILT = {
    "--speculative-algorithm": "DSPARK",
    "--speculative-dspark-block-size": "6", "--speculative-draft-model-path": "/nonexistent",
    "--kv-cache-dtype": "fp8_e5m2", "--enable-hierarchical-cache": None,
    "--hicache-ratio": "2.75", "--hicache-size": "100", "--hicache-write-policy": "write_through",
    "--hicache-io-backend": "direct", "--hicache-mem-layout": "page_first_direct",
    "--disaggregation-mode": "prefill", "--disaggregation-transfer-backend": "mooncake",
    # built on the all-to-all path at EP >= 2 (t_layouts.sh); refused at this table's EP 1
    "--enable-waterfill": None, "--enable-deepep-waterfill": None, "--enable-prefill-delayer": None,
    "--prefill-delayer-token-usage-low-watermark": "0.7", "--prefill-decode-interval": "20",
    "--enable-w4a4-mxfp4-megamoe": None,
    "--enforce-shared-experts-fusion": None,  # as the waterfill flags: a2a, EP >= 2 only
    "--enable-unified-cache-external-linker": None,
    "--unified-cache-external-linker-backend": "mori", "--tokenizer-worker-num": "8",
}
# values of a NOT_BUILT flag that are refused too (the flag-class test tries each)
# speculative algorithms that run (the checkpoint's MTP layer; n-gram lookup)
SPEC_IMPL_VALUES = ("none", "EAGLE", "NEXTN", "MTP", "NGRAM")
NOT_BUILT_VALUES = {"--speculative-algorithm": ["EAGLE3"],
                    "--kv-cache-dtype": ["fp8_e5m2", "fp16"],
                    "--disaggregation-mode": ["decode"]}

IMPL_VALUES = {"--tool-call-parser": ["deepseekv4"], "--reasoning-parser": ["deepseek-v4"]}

V4 = {"--enable-deepseek-v4-fp4-indexer": None, "--compress-state-dtype": "bf16",
      "--swa-full-tokens-ratio": "0.1"}

MULTI = {"--nnodes": "2", "--node-rank": "0", "--dist-init-addr": "10.0.0.1:5000"}

# SGLANG_* environment variables: read by the engine, or ignored with a warning
ENV_READ = {"SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK", "SGLANG_SIMULATE_ACC_LEN",
            "SGLANG_DSV4_COMPRESS_STATE_DTYPE", "SGLANG_DISABLE_STATIC_WATERFILL"}


def kind_of(flag, values):
    """The kind of one flag with its values (a list) as a recipe gives them, or None
    when the table does not know the flag."""
    v = values[0] if values else None
    if flag == "--speculative-algorithm" and v in SPEC_IMPL_VALUES:
        return "IMPL"
    if flag in NOT_BUILT:
        if flag in IMPL and v == IMPL[flag]:
            return "IMPL"
        if flag == "--kv-cache-dtype" and v in ("auto", "bf16", "bfloat16", "fp8_e4m3"):
            return "IMPL"
        return "NOT_BUILT"
    for name, table in (("IMPL", IMPL), ("GPU", GPU), ("V4", V4), ("MULTI", MULTI)):
        if flag in table:
            return name
    return None


def args_of(flag, value):
    if value is None:
        return [flag]
    if isinstance(value, list):
        return [flag] + value
    return [flag, value]
