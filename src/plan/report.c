/* report.c — the planner's two outputs: a readable table and the --json object (jansson).
 * Owns formatting only; every number comes from ms_plan_result.  Units: MB/GB are 10^6 /
 * 10^9 bytes and GiB 2^30, as the seeds print them.  Any thread (writes to the given FILE).
 */
#include "plan/plan.h"

#include <jansson.h>
#include <string.h>

static const char *weights_name(ms_plan_weights w)
{
    return w == MS_WEIGHTS_BF16 ? "bf16" : w == MS_WEIGHTS_FP4_EXPERTS ? "fp4-experts" : "fp8";
}

/* 1234567 -> "1,234,567" */
static const char *commas(int64_t v, char *buf, size_t cap)
{
    char tmp[32];
    int n = snprintf(tmp, sizeof tmp, "%lld", (long long)(v < 0 ? -v : v));
    size_t o = 0;
    if (v < 0 && o + 1 < cap) buf[o++] = '-';
    for (int i = 0; i < n && o + 2 < cap; i++) {
        buf[o++] = tmp[i];
        if ((n - i - 1) % 3 == 0 && i != n - 1) buf[o++] = ',';
    }
    buf[o] = 0;
    return buf;
}

int ms_plan_print(FILE *f, const ms_plan_input *in, const ms_plan_result *r)
{
    const ms_plan_model *m = &in->model;
    char a[32], b[32], c[32], d[32];
    fprintf(f, "moeserve plan: %s (%s weights)", m->name, weights_name(in->weights));
    if (in->have_gpu)
        fprintf(f, " on %d x %s (%.0f GB%s)", r->num_gpus, in->gpu.name, in->gpu.mem_gb,
                in->gpu.family == MS_GPU_CPU ? " per rank" : "");
    fprintf(f, "\n\nlayout      %s\n", r->layout_line);
    char table[2048];
    ms_layout_describe_table(&r->layout, table, sizeof table);
    const char *nl = strchr(table, '\n');
    if (nl) fprintf(f, "%s", nl + 1);
    fprintf(f, "\nweights     %.2f GB in total", r->weights_total_bytes / 1e9);
    if (r->recipe_min_weight_bytes > 0)
        fprintf(f, " (config-derived; the recipe declares about %.0f GB minimum)",
                r->recipe_min_weight_bytes / 1e9);
    fprintf(f, "\n            per rank %.2f GB:", r->weights_bytes_per_rank / 1e9);
    for (int k = 0; k < MS_WC_COUNT; k++) {
        double v = r->per_rank[k].elem + r->per_rank[k].scale;
        if (v > 0) fprintf(f, " %s %.2f,", ms_plan_component_name(k), v / 1e9);
    }
    fprintf(f, " (GB)\n");
    if (r->eplb_staging_bytes_per_rank > 0)
        fprintf(f, "            + EPLB staging (one layer's expert slots): %.1f MiB per rank\n",
                r->eplb_staging_bytes_per_rank / 1048576.0);
    if (r->attention_replication_bytes > 0)
        fprintf(f, "            attention replicated beyond 1/tp: %.2f GB per rank\n",
                r->attention_replication_bytes / 1e9);
    if (r->have_memory)
        fprintf(f, "memory      budget %.2f GB per device (%s); weights %s by %.2f GB\n",
                r->budget_bytes / 1e9, r->budget_basis,
                r->fits ? "fit with room" : "DO NOT FIT: short",
                (r->fits ? r->headroom_bytes : -r->headroom_bytes) / 1e9);
    fprintf(f, "KV          %.1f B per token per rank (at %s-token requests); %.3f GiB per request",
            r->kv_bytes_per_token, commas(r->context_len, a, sizeof a),
            r->kv_bytes_per_request / 1073741824.0);
    if (r->state_bytes_per_request > 0)
        fprintf(f, " + %.1f MB compressor state", r->state_bytes_per_request / 1e6);
    fprintf(f,
            "\n            pool %.2f GiB per rank: %s tokens per rank (%.2f exact); cluster "
            "distinct tokens %s\n",
            r->kv_pool_bytes_per_rank / 1073741824.0, commas(r->tokens_per_rank, a, sizeof a),
            r->tokens_per_rank_exact, commas(r->cluster_distinct_tokens, b, sizeof b));
    fprintf(f, "            requests of %s tokens: %s per rank, %s in the cluster, %s admitted\n",
            commas(r->context_len, a, sizeof a), commas(r->requests_per_rank, b, sizeof b),
            commas(r->cluster_requests, c, sizeof c), commas(r->admitted_requests, d, sizeof d));
    if (r->kv_cost.decode_flops > 0)
        fprintf(f,
                "            attention per rank at %s tokens (weights not included): a decode "
                "token reads %.2f MiB of KV cache, %.3g GFLOP; the prefill %.4g PFLOP\n",
                commas(r->context_len, a, sizeof a), r->kv_cost.read_bytes_total / 1048576.0,
                r->kv_cost.decode_flops / 1e9, r->kv_cost.prefill_flops / 1e15);
    if (in->launch.enable_hierarchical_cache)
        fprintf(f, "            HiCache host tier: %s tokens per rank (ratio %.2f)\n",
                commas(r->host_tokens_per_rank, a, sizeof a), in->launch.hicache_ratio);
    fprintf(f, "comm        T_g %.0f tokens per step, %.1f per attention rank\n",
            r->comm.tokens_global, r->comm.tokens_local);
    bool ep_mode = !strcmp(r->comm.mode, "ep"), gather_mode = !strcmp(r->comm.mode, "dp_gather");
    fprintf(f,
            "            DP gather + TP FFN (N=%d)%s: %.2f MB per layer per rank (all-gather %.2f "
            "MB)\n",
            r->comm.gather_world, gather_mode ? " [this layout]" : " [for comparison]",
            r->comm.dp_gather_bytes_per_layer / 1e6, r->comm.dp_allgather_bytes_per_layer / 1e6);
    if (r->comm.ep_world > 1 && m->n_routed > 0)
        fprintf(f,
                "            EP (N=%d, %.1f tokens per rank)%s: %.2f distinct ranks, %.5f remote; "
                "dispatch %.2f MB + "
                "combine %.2f MB = %.2f MB per layer per rank\n",
                r->comm.ep_world, r->comm.ep_tokens_per_rank,
                ep_mode ? " [this layout]" : " [for comparison]", r->comm.expected_distinct_ranks,
                r->comm.expected_remote_ranks, r->comm.ep_dispatch_bytes_per_layer / 1e6,
                r->comm.ep_combine_bytes_per_layer / 1e6,
                (r->comm.ep_dispatch_bytes_per_layer + r->comm.ep_combine_bytes_per_layer) / 1e6);
    fprintf(f, "            this layout: %s, %.3f GB per step per rank", r->comm.mode,
            r->comm.bytes_per_step / 1e9);
    if (r->comm.ideal_ms_per_step >= 0)
        fprintf(f, ", %.2f ms ideal at %.0f GB/s\n", r->comm.ideal_ms_per_step, r->comm.link_gb_s);
    else
        fprintf(f, " (no link bandwidth: give --link-gb-per-s)\n");
    if (m->n_routed > 0)
        fprintf(f,
                "experts     %.2f MB per expert (%.2f with scales), %.2f GB per layer, %.3f GB "
                "per rank per layer; expected active %.1f of %d at %.0f tokens\n",
                r->expert.per_expert / 1e6, r->expert.per_expert_with_scales / 1e6,
                r->expert.per_layer / 1e9, r->expert.per_rank_per_layer / 1e9,
                r->expert.expected_active_experts, m->n_routed, r->comm.tokens_global);
    fprintf(f, "attention   %.1f FLOP/byte at TP 1, %.1f in this layout\n", r->ai.flop_per_byte_tp1,
            r->ai.flop_per_byte_this_layout);
    if (r->n_violations) {
        fprintf(f, "violations\n");
        for (int i = 0; i < r->n_violations; i++)
            fprintf(f, "  [%s] %s\n", r->violations[i].rule, r->violations[i].message);
    } else {
        fprintf(f, "violations  none\n");
    }
    return 0;
}

static json_t *jreal_or_null(double v, bool ok)
{
    return ok ? json_real(v) : json_null();
}

void *ms_plan_to_json(const ms_plan_input *in, const ms_plan_result *r)
{
    const ms_layout *l = &r->layout;
    json_t *o = json_object();
    json_object_set_new(o, "model", json_string(in->model.name));
    json_object_set_new(o, "weights", json_string(weights_name(in->weights)));
    json_object_set_new(o, "gpu", in->have_gpu ? json_string(in->gpu.name) : json_null());
    json_object_set_new(o, "num_gpus", json_integer(r->num_gpus));
    json_t *lay =
        json_pack("{s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i}", "attn_tp", l->attn_tp, "attn_dp",
                  l->attn_dp, "attn_cp", l->attn_cp, "moe_tp", l->moe_tp, "moe_ep", l->moe_ep,
                  "dense_tp", l->dense_tp, "pp", l->pp, "tp", l->tp, "world_size", l->world_size,
                  "replicas", l->n_replicas, "shared_tp", l->shared_tp);
    json_object_set_new(lay, "experts_per_rank", json_integer(l->experts_per_rank));
    json_object_set_new(lay, "max_running_per_rank", json_integer(l->max_running_per_rank));
    json_object_set_new(lay, "chunked_prefill_per_rank", json_integer(l->chunked_prefill_per_rank));
    json_object_set_new(lay, "description", json_string(r->layout_line));
    json_object_set_new(o, "layout", lay);
    json_object_set_new(o, "fits", r->have_memory ? json_boolean(r->fits) : json_null());
    json_object_set_new(o, "weights_bytes_total", json_real(r->weights_total_bytes));
    json_object_set_new(o, "weights_bytes_per_rank", json_real(r->weights_bytes_per_rank));
    json_object_set_new(o, "eplb_staging_bytes_per_rank",
                        json_real(r->eplb_staging_bytes_per_rank));
    json_object_set_new(o, "recipe_min_weight_bytes",
                        jreal_or_null(r->recipe_min_weight_bytes, r->recipe_min_weight_bytes > 0));
    json_object_set_new(o, "attention_replication_bytes",
                        json_real(r->attention_replication_bytes));
    json_t *br = json_object();
    for (int k = 0; k < MS_WC_COUNT; k++)
        json_object_set_new(br, ms_plan_component_name(k),
                            json_pack("{s:f,s:f,s:f,s:f}", "total_elem", r->total[k].elem,
                                      "total_scale", r->total[k].scale, "per_rank_elem",
                                      r->per_rank[k].elem, "per_rank_scale", r->per_rank[k].scale));
    json_object_set_new(o, "weights_breakdown", br);
    json_object_set_new(o, "budget_bytes_per_rank", jreal_or_null(r->budget_bytes, r->have_memory));
    json_object_set_new(o, "headroom_bytes", jreal_or_null(r->headroom_bytes, r->have_memory));
    json_object_set_new(o, "context_len", json_integer(r->context_len));
    json_object_set_new(o, "kv_bytes_per_token", json_real(r->kv_bytes_per_token));
    json_object_set_new(o, "kv_bytes_per_request", json_real(r->kv_bytes_per_request));
    json_object_set_new(o, "state_bytes_per_request", json_real(r->state_bytes_per_request));
    json_object_set_new(o, "kv_pool_bytes_per_rank", json_real(r->kv_pool_bytes_per_rank));
    json_object_set_new(o, "tokens_per_rank", json_integer(r->tokens_per_rank));
    json_object_set_new(o, "tokens_per_rank_exact", json_real(r->tokens_per_rank_exact));
    json_object_set_new(o, "cluster_distinct_tokens", json_integer(r->cluster_distinct_tokens));
    json_object_set_new(o, "requests_per_rank", json_integer(r->requests_per_rank));
    json_object_set_new(o, "cluster_requests", json_integer(r->cluster_requests));
    json_object_set_new(o, "admitted_requests", json_integer(r->admitted_requests));
    json_object_set_new(o, "host_tokens_per_rank", json_integer(r->host_tokens_per_rank));
    json_object_set_new(o, "decode_kv_read_bytes", json_real(r->kv_cost.read_bytes_total));
    json_object_set_new(o, "decode_attention_flops", json_real(r->kv_cost.decode_flops));
    json_object_set_new(o, "prefill_attention_flops", json_real(r->kv_cost.prefill_flops));
    json_t *cm = json_object();
    json_object_set_new(cm, "mode", json_string(r->comm.mode ? r->comm.mode : "none"));
    json_object_set_new(cm, "tokens_per_step", json_real(r->comm.tokens_global));
    json_object_set_new(cm, "tokens_per_rank", json_real(r->comm.tokens_local));
    json_object_set_new(cm, "gather_world", json_integer(r->comm.gather_world));
    json_object_set_new(cm, "dp_allgather_bytes_per_layer",
                        json_real(r->comm.dp_allgather_bytes_per_layer));
    json_object_set_new(cm, "dp_gather_bytes_per_layer",
                        json_real(r->comm.dp_gather_bytes_per_layer));
    json_object_set_new(cm, "tp_allreduce_bytes_per_layer",
                        json_real(r->comm.tp_allreduce_bytes_per_layer));
    json_object_set_new(cm, "ep_world", json_integer(r->comm.ep_world));
    json_object_set_new(cm, "ep_tokens_per_rank", json_real(r->comm.ep_tokens_per_rank));
    json_object_set_new(cm, "ep_dispatch_bytes_per_layer",
                        json_real(r->comm.ep_dispatch_bytes_per_layer));
    json_object_set_new(cm, "ep_combine_bytes_per_layer",
                        json_real(r->comm.ep_combine_bytes_per_layer));
    json_object_set_new(cm, "expected_distinct_ranks", json_real(r->comm.expected_distinct_ranks));
    json_object_set_new(cm, "expected_remote_ranks", json_real(r->comm.expected_remote_ranks));
    json_object_set_new(cm, "gather_layers", json_integer(r->comm.gather_layers));
    json_object_set_new(cm, "moe_layers", json_integer(r->comm.moe_layers));
    json_object_set_new(cm, "bytes_per_step", json_real(r->comm.bytes_per_step));
    json_object_set_new(cm, "link_gb_per_s",
                        jreal_or_null(r->comm.link_gb_s, r->comm.link_gb_s > 0));
    json_object_set_new(cm, "ideal_ms_per_step",
                        jreal_or_null(r->comm.ideal_ms_per_step, r->comm.ideal_ms_per_step >= 0));
    json_object_set_new(o, "comm", cm);
    json_object_set_new(
        o, "expert_bytes",
        json_pack("{s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f}", "per_expert", r->expert.per_expert,
                  "per_expert_with_scales", r->expert.per_expert_with_scales, "per_layer",
                  r->expert.per_layer, "per_rank_per_layer", r->expert.per_rank_per_layer,
                  "per_rank_per_step", r->expert.per_rank_per_step, "expected_active_experts",
                  r->expert.expected_active_experts, "expected_per_rank_per_layer",
                  r->expert.expected_per_rank_per_layer, "expected_per_rank_per_step",
                  r->expert.expected_per_rank_per_step));
    json_object_set_new(o, "attention_ai",
                        json_pack("{s:f,s:f}", "flop_per_byte_tp1", r->ai.flop_per_byte_tp1,
                                  "flop_per_byte_this_layout", r->ai.flop_per_byte_this_layout));
    json_t *v = json_array();
    for (int i = 0; i < r->n_violations; i++)
        json_array_append_new(v, json_pack("{s:s,s:s}", "rule", r->violations[i].rule, "message",
                                           r->violations[i].message));
    json_object_set_new(o, "violations", v);
    return o;
}
