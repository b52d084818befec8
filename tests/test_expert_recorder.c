/* test_expert_recorder.c — the recorder's window and statistics (moe/expert_recorder.h):
 * hits map through the placement, only the last `window` passes are dumped, a pass
 * outside a recording is not kept, a dump resets, and balancedness per layer is
 * (mean + 1e-5) / (max + 1e-5) of per-rank hits; per_token dumps each pass's tokens
 * and the physical experts they went to, keeps at most max_tokens rows (the oldest
 * passes' go first), and a discarded pass (the warm-up) leaves no trace. */
#include "harness.h"
#include "moe/expert_recorder.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

static long long lc(json_t *d, int l, int e)
{
    return (long long)json_integer_value(
        json_array_get(json_array_get(json_object_get(d, "logical_count"), (size_t)l), (size_t)e));
}

TEST(window_and_balancedness)
{
    /* 2 layers (layer 0 dense), 4 experts over 2 ranks; layer 1 placed [2, 3, 0, 1] */
    ms_expert_map maps[2];
    ms_errbuf err = {{0}};
    int32_t perm[4] = {2, 3, 0, 1};
    CHECK(!ms_expert_map_init_identity(&maps[0], 4, 2, &err));
    CHECK(!ms_expert_map_init_from(&maps[1], 4, 2, perm, &err));
    ms_expert_recorder *r = ms_expert_recorder_new(MS_REC_STAT, 2, 4, 4, 2, 2, 2, 0, maps);
    CHECK(r);
    int32_t a[2 * 2] = {0, 1, 0, 2}; /* 2 rows, top-2: logical 0 x2, 1, 2 */
    ms_expert_recorder_add(r, 1, &maps[1], a, 2, 2);
    CHECK(!ms_expert_recorder_end_pass(r, NULL, &err)); /* not recording: not kept */
    /* logical 0 and 1 sit on slots 2, 3 (rank 1), logical 2 on slot 0 (rank 0): 1 vs 3 */
    CHECK_NEAR(ms_expert_recorder_layer_balancedness(r, 1), (2 + 1e-5) / (3 + 1e-5), 1e-9);
    CHECK_NEAR(ms_expert_recorder_layer_balancedness(r, 0), 1.0, 0);
    ms_expert_recorder_start(r);
    for (int pass = 0; pass < 3; pass++) { /* passes of 1, 1, 2 hits on logical 3 */
        int32_t b[4] = {3, -1, 3, 3};
        ms_expert_recorder_add(r, 1, &maps[1], b, pass + 1, 1);
        CHECK(!ms_expert_recorder_end_pass(r, NULL, &err));
    }
    json_t *d = ms_expert_recorder_dump(r);
    CHECK(d);
    CHECK(json_integer_value(json_object_get(d, "num_passes")) == 2);
    CHECK(lc(d, 1, 3) == 1 + 2 && lc(d, 1, 0) == 0 && lc(d, 0, 3) == 0);
    json_t *p2l = json_array_get(json_object_get(d, "physical_to_logical_map"), 1);
    CHECK(json_integer_value(json_array_get(p2l, 0)) == 2);
    json_decref(d);
    d = ms_expert_recorder_dump(r); /* reset */
    CHECK(json_integer_value(json_object_get(d, "num_passes")) == 0 && lc(d, 1, 3) == 0);
    json_decref(d);
    ms_recorder_stats st;
    ms_expert_recorder_stats(r, &st);
    CHECK(st.passes == 4 && st.recording);
    /* the last pass: 2 hits on logical 3 = slot 1, rank 0 */
    CHECK_NEAR(st.last, (1 + 1e-5) / (2 + 1e-5), 1e-9);
    CHECK(st.touched_max == 1.0 && st.touched_mean == 0.5); /* one slot read, on rank 0 */
    ms_expert_recorder_free(r);
    ms_expert_map_deinit(&maps[0]);
    ms_expert_map_deinit(&maps[1]);
}

TEST(modes)
{
    int m = -1;
    ms_errbuf err = {{0}};
    CHECK(!ms_recorder_mode_parse("stat", &m, &err) && m == MS_REC_STAT);
    CHECK(!ms_recorder_mode_parse("per_pass", &m, &err) && m == MS_REC_PER_PASS);
    CHECK(!ms_recorder_mode_parse("per_token", &m, &err) && m == MS_REC_PER_TOKEN);
    CHECK(ms_recorder_mode_parse("nope", &m, &err) == MS_EINVAL);
}

static long long at(json_t *a, int i)
{
    return (long long)json_integer_value(json_array_get(a, (size_t)i));
}

/* The ids of a JSON integer array as "a,b,c" (for comparisons). */
static const char *ids_str(json_t *a, char *buf, size_t cap)
{
    size_t o = 0;
    buf[0] = 0;
    for (size_t i = 0; i < json_array_size(a) && o + 24 < cap; i++)
        o += (size_t)snprintf(buf + o, cap - o, i ? ",%lld" : "%lld", at(a, (int)i));
    return buf;
}

TEST(per_token)
{
    /* 2 layers (layer 0 dense), 4 logical experts on 6 physical slots over 2 ranks:
     * layer 1's placement [2, 3, 0 | 1, 0, 2], this rank's choice for logical 0 is slot 4 */
    ms_expert_map maps[2];
    ms_errbuf err = {{0}};
    int32_t p2l[6] = {2, 3, 0, 1, 0, 2};
    CHECK(
        !ms_expert_map_init_replicas(&maps[0], 4, 6, 2, 1, 0, (int32_t[]){0, 1, 2, 3, 0, 1}, &err));
    CHECK(!ms_expert_map_init_replicas(&maps[1], 4, 6, 2, 1, 1, p2l, &err));
    ms_expert_recorder *r = ms_expert_recorder_new(MS_REC_PER_TOKEN, 2, 4, 6, 2, 4, 2, 5, maps);
    CHECK(r);
    /* the warm-up: discarded */
    int32_t w[2] = {3, 3};
    ms_expert_recorder_add_seq(r, (int32_t[]){9}, 1, 0, MS_REC_SEQ_EXTEND);
    ms_expert_recorder_add(r, 1, &maps[1], w, 1, 2);
    ms_expert_recorder_discard_pass(r);
    ms_expert_recorder_start(r);
    /* pass A: a 2-token prompt at 0 and a decode at 7: 3 rows, top-2 */
    int32_t ids[3] = {11, 12, 40}, a[6] = {0, 1, 2, 3, 0, -1};
    ms_expert_recorder_add_seq(r, ids, 2, 0, MS_REC_SEQ_EXTEND);
    ms_expert_recorder_add_seq(r, ids + 2, 1, 7, MS_REC_SEQ_DECODE);
    ms_expert_recorder_add(r, 1, &maps[1], a, 3, 2);
    CHECK(!ms_expert_recorder_end_pass(r, NULL, &err));
    /* pass B: two decodes */
    int32_t b[4] = {1, 3, 2, 0};
    ms_expert_recorder_add_seq(r, (int32_t[]){5}, 1, 2, MS_REC_SEQ_DECODE);
    ms_expert_recorder_add_seq(r, (int32_t[]){6}, 1, 8, MS_REC_SEQ_DECODE);
    ms_expert_recorder_add(r, 1, &maps[1], b, 2, 2);
    CHECK(!ms_expert_recorder_end_pass(r, NULL, &err));
    json_t *d = ms_expert_recorder_dump(r);
    CHECK(d);
    json_t *recs = json_object_get(d, "records");
    CHECK(json_array_size(recs) == 2 &&
          !strcmp(json_string_value(json_object_get(d, "mode")), "per_token"));
    json_t *ra = json_array_get(recs, 0), *rb = json_array_get(recs, 1);
    char buf[256];
    CHECK(!strcmp(ids_str(json_object_get(ra, "input_ids"), buf, sizeof buf), "11,12,40"));
    CHECK(!strcmp(ids_str(json_object_get(ra, "positions"), buf, sizeof buf), "0,1,7"));
    CHECK(!strcmp(ids_str(json_object_get(ra, "extend_seq_lens"), buf, sizeof buf), "2,1"));
    CHECK(!strcmp(json_string_value(json_object_get(ra, "forward_mode")), "MIXED"));
    CHECK(!strcmp(json_string_value(json_object_get(rb, "forward_mode")), "DECODE"));
    /* physical ids: this rank's own replicas (logical 0 → 4, 2 → 5, 1 → 3), else the
     * only one (3 → 1); the dense layer routes nothing (-1) */
    json_t *l1 = json_array_get(json_object_get(ra, "topk_ids_of_layer"), 1);
    json_t *l0 = json_array_get(json_object_get(ra, "topk_ids_of_layer"), 0);
    CHECKF(maps[1].physical_of[0] == 4 && maps[1].physical_of[2] == 5, "choices %d %d",
           maps[1].physical_of[0], maps[1].physical_of[2]);
    CHECK(!strcmp(ids_str(json_array_get(l1, 0), buf, sizeof buf), "4,3"));
    CHECK(!strcmp(ids_str(json_array_get(l1, 1), buf, sizeof buf), "5,1"));
    CHECK(!strcmp(ids_str(json_array_get(l1, 2), buf, sizeof buf), "4,-1"));
    CHECK(!strcmp(ids_str(json_array_get(l0, 2), buf, sizeof buf), "-1,-1"));
    json_t *gpc = json_array_get(json_object_get(ra, "global_physical_count"), 1);
    CHECK(!strcmp(ids_str(gpc, buf, sizeof buf), "0,1,0,1,2,1"));
    /* logical_count over both passes (warm-up excluded): 0: 2 + 1, 1: 1 + 1, 2: 1 + 1, 3: 1 + 1 */
    CHECK(!strcmp(ids_str(json_array_get(json_object_get(d, "logical_count"), 1), buf, sizeof buf),
                  "3,2,2,2"));
    CHECK(json_array_size(json_object_get(d, "last_physical_to_logical_map")) == 2);
    json_decref(d);
    /* the cap: 5 rows.  Passes of 3 and 2 rows fit; a third of 2 pushes the first out; a
     * pass of 7 keeps its first 5 rows and pushes out everything else */
    int32_t c[14] = {0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1};
    int32_t t7[7] = {1, 2, 3, 4, 5, 6, 7};
    int sizes[4] = {3, 2, 2, 7};
    int64_t dumped[4][2] = {{0}};
    for (int step = 0; step < 4; step++) {
        ms_expert_recorder_add_seq(r, t7, sizes[step], 0, MS_REC_SEQ_EXTEND);
        ms_expert_recorder_add(r, 1, &maps[1], c, sizes[step], 2);
        CHECK(!ms_expert_recorder_end_pass(r, NULL, &err));
        d = ms_expert_recorder_dump(r);
        recs = json_object_get(d, "records");
        dumped[step][0] = (int64_t)json_array_size(recs);
        dumped[step][1] =
            json_integer_value(json_object_get(json_array_get(recs, 0), "num_tokens")) * 100 +
            (int64_t)json_array_size(json_object_get(json_array_get(recs, 0), "input_ids"));
        json_decref(d);
        if (step == 1) { /* keep passes 1-2 in the window: add pass 2 without a dump between */
            ms_expert_recorder_add_seq(r, t7, 3, 0, MS_REC_SEQ_EXTEND);
            ms_expert_recorder_add(r, 1, &maps[1], c, 3, 2);
            CHECK(!ms_expert_recorder_end_pass(r, NULL, &err));
            ms_expert_recorder_add_seq(r, t7, 2, 0, MS_REC_SEQ_EXTEND);
            ms_expert_recorder_add(r, 1, &maps[1], c, 2, 2);
            CHECK(!ms_expert_recorder_end_pass(r, NULL, &err));
            ms_expert_recorder_add_seq(r, t7, 2, 0, MS_REC_SEQ_EXTEND);
            ms_expert_recorder_add(r, 1, &maps[1], c, 2, 2);
            CHECK(!ms_expert_recorder_end_pass(r, NULL, &err));
            d = ms_expert_recorder_dump(r); /* 3 passes, 7 rows: the first left the ring */
            recs = json_object_get(d, "records");
            CHECKF(json_array_size(recs) == 2 &&
                       json_integer_value(json_object_get(d, "num_passes")) == 3,
                   "%zu records", json_array_size(recs));
            json_decref(d);
        }
    }
    CHECK(dumped[0][0] == 1 && dumped[0][1] == 303);
    CHECK(dumped[3][0] == 1 && dumped[3][1] == 705); /* 7 tokens, 5 kept */
    ms_expert_recorder_free(r);
    ms_expert_map_deinit(&maps[0]);
    ms_expert_map_deinit(&maps[1]);
    /* sizes out of range */
    CHECK(!ms_expert_recorder_new(MS_REC_PER_TOKEN, 2, 4, 4, 2, 4, 2, 0, NULL));
    CHECK(!ms_expert_recorder_new(MS_REC_STAT, 2, 4, 4, 2, 4, 5, 0, NULL));
}

int main(void)
{
    RUN(window_and_balancedness);
    RUN(per_token);
    RUN(modes);
    return TEST_REPORT();
}
