/* test_expert_recorder.c — the recorder's window and statistics (moe/expert_recorder.h):
 * hits map through the placement, only the last `window` passes are dumped, a pass
 * outside a recording is not kept, a dump resets, and balancedness per layer is
 * (mean + 1e-5) / (max + 1e-5) of per-rank hits. */
#include "harness.h"
#include "moe/expert_recorder.h"

#include <jansson.h>
#include <stdlib.h>

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
    ms_expert_recorder *r = ms_expert_recorder_new(MS_REC_STAT, 2, 4, 4, 2, 2, maps);
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
    CHECK(ms_recorder_mode_parse("per_token", &m, &err) == MS_EUNSUPPORTED);
    CHECK(ms_recorder_mode_parse("nope", &m, &err) == MS_EINVAL);
}

int main(void)
{
    RUN(window_and_balancedness);
    RUN(modes);
    return TEST_REPORT();
}
