/* test_kv_cache.c — the KV cache of streams with DeepSeek-V4 Flash's shape
 * (its planner preset through the planner-only V4 family's kv_spec, before
 * V4 can be loaded):
 * streams at 1, 1/4 and 1/128 of the token rate, one of them windowed;
 * pages needed per step; reserve and release; window pages freed as they
 * slide out; sharing of every stream's pages as a prefix hit does; the
 * state slots; exhaustion (all or nothing) and retraction; and the view. */
#include "harness.h"
#include "cache/kv_budget.h"
#include "cache/kv_cache.h"
#include "model/family.h"
#include "plan/plan.h"

#include <string.h>

#define PS 4
enum { WIN = 0, C4 = 1, C128 = 2, IDX = 3 };

static ms_kv_spec spec;

static int v4_spec(int draft_tokens)
{
    ms_model_shape s;
    ms_errbuf err;
    ms_kv_spec_opts o = {
        .state_bytes = 4, .page_size = PS, .attn_tp = 1, .draft_tokens = draft_tokens};
    if (ms_plan_model_preset("deepseek-v4-flash", &s, &err) ||
        ms_family_kv_spec(&s, &o, &spec, &err))
        return -1;
    return 0;
}

static int64_t live_pages(const ms_kv_seq *q, int s)
{
    int64_t n = 0;
    for (int64_t i = 0; i < q->n_pages[s]; i++) n += q->pages[s][i] >= 0;
    return n;
}

TEST(pages_per_step_and_window_slide)
{
    CHECK(v4_spec(3) == 0);
    int32_t pages[MS_KV_MAX_STREAMS];
    ms_kv_cache_pages_for(&spec, PS, 4096, 2, 16, 0, pages);
    /* full-history streams: 4096 tokens of each; the window: 2 sequences × 2 windows (the
     * running one, the one kept at the last share unit) × (⌈131 / 4⌉ + 2) + 16 / 4 */
    CHECK(pages[C4] == 4096 / 16 && pages[C128] == 4096 / 512 && pages[IDX] == 4096 / 16);
    CHECK(pages[WIN] == 2 * 2 * (33 + 2) + 4);
    ms_kv_cache *c;
    ms_errbuf err;
    CHECKF(ms_kv_cache_new(&c, &spec, PS, pages, MS_DT_BF16, 2, &err) == 0, "%s", err.msg);
    CHECK(ms_kv_cache_tokens(c) == 4096 && ms_kv_cache_share_unit(c) == PS * 128);
    ms_kv_seq q;
    ms_kv_seq_init(&q);
    int64_t need[MS_KV_MAX_STREAMS];
    /* the first token: one window page; no compressed entry is complete yet */
    CHECK(ms_kv_cache_pages_needed(c, &q, 1, need) == 1 && need[WIN] == 1 && need[C4] == 0 &&
          need[C128] == 0);
    /* token 4: the first c4 entry (and index key); token 128: the first c128 entry */
    CHECK(ms_kv_cache_pages_needed(c, &q, 4, need) == 3 && need[C4] == 1 && need[IDX] == 1);
    CHECK(ms_kv_cache_pages_needed(c, &q, 128, need) && need[C128] == 1 && need[WIN] == 32);
    /* decode token by token to 1000, sliding the window after each step */
    int64_t c4_steps = 0, c128_steps = 0;
    for (int64_t t = 1; t <= 1000; t++) {
        ms_kv_cache_pages_needed(c, &q, t, need);
        c4_steps += need[C4] > 0;
        c128_steps += need[C128] > 0;
        CHECK(ms_kv_cache_reserve(c, &q, t) == 0);
        ms_kv_cache_slide(c, &q, t);
    }
    /* a c4 page every 16 tokens, a c128 page every 512 */
    CHECK(c4_steps == 63 && c128_steps == 2);
    CHECK(q.n_pages[C4] == 63 && q.n_pages[C128] == 2 && q.n_pages[IDX] == 63);
    /* the window holds only the pages of the last 131 tokens (entries 869..999) and of
     * the 131 before the last share unit, 512 (entries 381..511) */
    CHECK(q.n_pages[WIN] == 250 && q.first_live[WIN] == 381 / PS);
    CHECK(live_pages(&q, WIN) == (250 - 217) + (128 - 95));
    CHECK(q.pages[WIN][128] == -1 && q.pages[WIN][216] == -1 && q.pages[WIN][127] >= 0);
    CHECK(ms_kv_cache_n_free(c, WIN) == pages[WIN] - 66);
    CHECK(q.state_slot >= 0);
    ms_kv_cache_release(c, &q);
    for (int s = 0; s < 4; s++) CHECK(ms_kv_cache_n_free(c, s) == pages[s]);
    CHECK(q.state_slot == -1 && q.n_tokens == 0);
    ms_kv_seq_deinit(&q);
    ms_kv_cache_free(c);
}

TEST(sharing_every_stream)
{
    CHECK(v4_spec(0) == 0);
    int32_t pages[MS_KV_MAX_STREAMS];
    ms_kv_cache_pages_for(&spec, PS, 4096, 4, 1024, 0, pages); /* steps of up to 1024 tokens */
    ms_kv_cache *c;
    ms_errbuf err;
    CHECK(ms_kv_cache_new(&c, &spec, PS, pages, MS_DT_BF16, 4, &err) == 0);
    ms_kv_seq a, b, d;
    ms_kv_seq_init(&a), ms_kv_seq_init(&b), ms_kv_seq_init(&d);
    CHECK(ms_kv_cache_reserve(c, &a, 512) == 0);
    ms_kv_cache_slide(c, &a, 512);
    int32_t used[4];
    for (int s = 0; s < 4; s++) used[s] = pages[s] - ms_kv_cache_n_free(c, s);
    /* b takes a's 512-token prefix: references, not new pages */
    CHECK(ms_kv_cache_share(c, &b, &a, 511) == MS_EINVAL); /* not whole pages of c128 */
    CHECK(ms_kv_cache_share(c, &b, &a, 512) == 0);
    for (int s = 0; s < 4; s++) CHECK(pages[s] - ms_kv_cache_n_free(c, s) == used[s]);
    CHECK(b.n_pages[C128] == 1 && b.pages[C128][0] == a.pages[C128][0]);
    CHECK(b.first_live[WIN] == (512 - 128) / PS && b.pages[WIN][100] == a.pages[WIN][100]);
    /* b continues on its own pages; a is released and b still holds the prefix */
    CHECK(ms_kv_cache_reserve(c, &b, 700) == 0);
    CHECK(b.pages[C4][32] != a.pages[C4][31] && b.state_slot >= 0 && b.state_slot != a.state_slot);
    ms_kv_cache_release(c, &a);
    CHECK(pages[C128] - ms_kv_cache_n_free(c, C128) == 2); /* b's 2 pages, one shared */
    /* a prefix whose window slid out is no longer whole: its tail is recomputed */
    CHECK(ms_kv_cache_reserve(c, &a, 1024) == 0);
    ms_kv_cache_slide(c, &a, 1024);
    CHECK(ms_kv_cache_share(c, &d, &a, 512) == MS_EINVAL);
    CHECK(ms_kv_cache_share(c, &d, &a, 1024) == 0);
    ms_kv_cache_release(c, &a), ms_kv_cache_release(c, &b), ms_kv_cache_release(c, &d);
    for (int s = 0; s < 4; s++) CHECK(ms_kv_cache_n_free(c, s) == pages[s]);
    ms_kv_seq_deinit(&a), ms_kv_seq_deinit(&b), ms_kv_seq_deinit(&d);
    ms_kv_cache_free(c);
}

TEST(exhaustion_is_all_or_nothing_and_retraction_frees)
{
    CHECK(v4_spec(0) == 0);
    /* room for 2 sequences of 1024 tokens in c128 (2 pages each), plenty elsewhere */
    int32_t pages[MS_KV_MAX_STREAMS] = {1000, 1000, 4, 1000};
    ms_kv_cache *c;
    ms_errbuf err;
    CHECK(ms_kv_cache_new(&c, &spec, PS, pages, MS_DT_BF16, 3, &err) == 0);
    ms_kv_seq q[3];
    for (int i = 0; i < 3; i++) ms_kv_seq_init(&q[i]);
    CHECK(ms_kv_cache_reserve(c, &q[0], 1024) == 0 && ms_kv_cache_reserve(c, &q[1], 1024) == 0);
    int32_t before[4];
    for (int s = 0; s < 4; s++) before[s] = ms_kv_cache_n_free(c, s);
    CHECK(ms_kv_cache_reserve(c, &q[2], 600) == MS_EFULL);                    /* c128 is short */
    for (int s = 0; s < 4; s++) CHECK(ms_kv_cache_n_free(c, s) == before[s]); /* nothing taken */
    CHECK(q[2].n_pages[WIN] == 0 && q[2].state_slot == -1);
    /* retract the first: its pages return and the third fits */
    ms_kv_cache_release(c, &q[0]);
    CHECK(ms_kv_cache_reserve(c, &q[2], 600) == 0);
    /* state slots run out too: three sequences, three slots */
    CHECK(ms_kv_cache_reserve(c, &q[0], 4) == 0);
    ms_kv_seq e;
    ms_kv_seq_init(&e);
    int32_t win_free = ms_kv_cache_n_free(c, WIN);
    CHECK(ms_kv_cache_reserve(c, &e, 4) == MS_EFULL && ms_kv_cache_n_free(c, WIN) == win_free);
    for (int i = 0; i < 3; i++) ms_kv_cache_release(c, &q[i]), ms_kv_seq_deinit(&q[i]);
    ms_kv_seq_deinit(&e);
    for (int s = 0; s < 4; s++) CHECK(ms_kv_cache_n_free(c, s) == pages[s]);
    ms_kv_cache_free(c);
}

TEST(view_reads_what_was_written)
{
    CHECK(v4_spec(0) == 0);
    int32_t pages[MS_KV_MAX_STREAMS] = {200, 100, 10, 100};
    ms_kv_cache *c;
    ms_errbuf err;
    CHECK(ms_kv_cache_new(&c, &spec, PS, pages, MS_DT_BF16, 1, &err) == 0);
    ms_kv_seq q;
    ms_kv_seq_init(&q);
    CHECK(ms_kv_cache_reserve(c, &q, 300) == 0);
    ms_kv_view v = {c, &q};
    CHECK(ms_kv_view_entry_elems(&v, WIN) == 584 && ms_kv_view_entry_elems(&v, IDX) == 68);
    /* layer 2 is CSA (ratio 4), layer 3 HCA (128), layers 0-1 window only */
    CHECK(ms_kv_view_entry(&v, C4, 2, 40) && !ms_kv_view_entry(&v, C4, 3, 40) &&
          !ms_kv_view_entry(&v, C4, 0, 40) && ms_kv_view_entry(&v, C128, 3, 200) &&
          !ms_kv_view_entry(&v, C128, 3, 600));
    /* tokens 40..43 share one c4 entry; different layers and tokens do not alias */
    CHECK(ms_kv_view_entry(&v, C4, 2, 40) == ms_kv_view_entry(&v, C4, 2, 43));
    CHECK(ms_kv_view_entry(&v, C4, 2, 40) != ms_kv_view_entry(&v, C4, 4, 40));
    for (int64_t t = 0; t < 300; t++) memset(ms_kv_view_entry(&v, WIN, 5, t), (int)(t & 0x7f), 584);
    int ok = 1;
    for (int64_t t = 0; t < 300; t++)
        ok &= ((uint8_t *)ms_kv_view_entry(&v, WIN, 5, t))[583] == (t & 0x7f);
    CHECK(ok);
    ms_kv_cache_slide(c, &q, 300);
    CHECK(!ms_kv_view_entry(&v, WIN, 5, 100) && ms_kv_view_entry(&v, WIN, 5, 299));
    CHECK(ms_kv_view_state(&v) != NULL);
    ms_kv_cache_release(c, &q);
    ms_kv_seq_deinit(&q);
    ms_kv_cache_free(c);
}

/* --swa-full-tokens-ratio as SGLang's DSV4 pool configurator: the whole-
 * history pools (c4, c128, index keys: the compressed histories span the whole
 * context) hold N tokens, the window pool r × N, N from the budget ÷ (their
 * bytes per token + r × the window's); without r the windows are sized by the
 * running requests; capacity per pool and the maximum concurrency. */
TEST(swa_full_tokens_ratio_and_capacity)
{
    CHECK(v4_spec(0) == 0);
    /* Flash: 21 CSA layers, 20 HCA, 43 in all; 584-byte main entries, 68-byte MXFP4 keys */
    double full = 584.0 * 21 / 4 + 584.0 * 20 / 128 + 68.0 * 21 / 4, win = 584.0 * 43;
    CHECK((double)ms_kv_spec_token_bytes(&spec) == floor(full));
    CHECK_NEAR(ms_kv_spec_window_token_bytes(&spec), win, 1e-9);
    ms_kv_budget_in bi = {.mem_fraction_static = 0.5,
                          .avail_bytes = 4000000000LL,
                          .weight_bytes = 900000000LL,
                          .fixed_bytes = 100000000LL,
                          .swa_ratio = 0.1,
                          .page_size = PS};
    int64_t tokens;
    ms_errbuf err;
    CHECK(ms_kv_budget_tokens(&spec, &bi, &tokens, &err) == 0);
    CHECK(tokens == (int64_t)(1000000000.0 / (floor(full) + 0.1 * win)));
    bi.swa_ratio = 0; /* the windows are fixed bytes: every byte left goes to the histories */
    CHECK(ms_kv_budget_tokens(&spec, &bi, &tokens, &err) == 0);
    CHECK(tokens == (int64_t)(1000000000.0 / floor(full)));
    bi.fixed_bytes = 1100000000LL; /* nothing left */
    CHECK(ms_kv_budget_tokens(&spec, &bi, &tokens, &err) == MS_ENOMEM);
    /* the window pool: r × N tokens, at least one request's window (2 × (⌈128 / 4⌉ + 2)) and a step
     */
    int32_t pages[MS_KV_MAX_STREAMS];
    ms_kv_cache_pages_for(&spec, PS, 100000, 8, 16, 10000, pages);
    CHECK(pages[WIN] == 2500 && pages[C4] == 100000 / 16);
    ms_kv_cache_pages_for(&spec, PS, 100000, 8, 16, 10, pages);
    CHECK(pages[WIN] == 68 + 4);
    ms_kv_cache_pages_for(&spec, PS, 4096, 2, 16, 0, pages);
    CHECK(pages[WIN] == 2 * 68 + 4);
    ms_kv_cache *c;
    CHECK(ms_kv_cache_new(&c, &spec, PS, pages, MS_DT_BF16, 8, &err) == 0);
    ms_kv_pool_info pi[MS_KV_MAX_STREAMS];
    CHECK(ms_kv_cache_pool_info(c, pi) == 4);
    CHECK(!strcmp(pi[C4].name, "c4") && pi[C4].pages == 256 && pi[C4].page_tokens == 16 &&
          pi[C4].tokens == 4096 && pi[C4].window == 0 && pi[C4].n_layers == 21);
    CHECK(pi[C128].page_tokens == 512 && pi[C128].tokens == 4096 && pi[C128].n_layers == 20);
    CHECK(pi[WIN].window == 128 && pi[WIN].n_layers == 43 && pi[WIN].pages == 140);
    CHECK_NEAR(pi[IDX].bytes, 256.0 * PS * 68 * 21, 1e-6);
    /* 1024-token requests: 4 fit the histories, the windows hold 140 / 68 of them */
    CHECK_NEAR(ms_kv_cache_concurrency(c, 1024), 140.0 / 68, 1e-12);
    CHECK_NEAR(ms_kv_cache_concurrency(c, 4096), 1.0, 1e-12);
    CHECK(ms_kv_cache_concurrency(c, 8192) < 1);
    ms_kv_cache_free(c);
    CHECK(ms_kv_cache_new(&c, &spec, PS, pages, MS_DT_BF16, 1, &err) == 0);
    CHECK_NEAR(ms_kv_cache_concurrency(c, 1024), 1.0, 1e-12); /* one state slot */
    ms_kv_cache_free(c);
}

int main(void)
{
    RUN(pages_per_step_and_window_slide);
    RUN(sharing_every_stream);
    RUN(exhaustion_is_all_or_nothing_and_retraction_frees);
    RUN(view_reads_what_was_written);
    RUN(swa_full_tokens_ratio_and_capacity);
    return TEST_REPORT();
}
