/* test_comm.c — the communication layer as a singleton (world size 1, no mpirun) plus its pure
 * parts: rank arithmetic against SGLang's group construction, the mpirun command line, the
 * launcher checks.  Multi-rank behaviour is tested by tests/t_comm.sh (moeserve comm-check). */
#include "harness.h"
#include "parallel/comm.h"

#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* OpenMPI keeps allocations until exit; LeakSanitizer would report them (SANITIZE=1 builds). */
const char *__asan_default_options(void);
const char *__asan_default_options(void)
{
    return "detect_leaks=0";
}

/* ---- pure: rank arithmetic -------------------------------------------------------------- */

/* SGLang's initialize_model_parallel loops (one replica = one TP group), written out as member
 * lists: returns the index of the group of kind k containing world rank w and its position. */
/* The group sizes of one replica, in the order the cases below list them. */
struct dims {
    int tp, attn_tp, attn_dp, moe_ep, moe_tp, dense_tp, n_replicas;
};

/* A layout with those sizes (pp 1, cp 1), as ms_layout_resolve would leave it. */
static ms_layout lay_of(const struct dims *d)
{
    ms_layout l = {.tp = d->tp,
                   .pp = 1,
                   .n_replicas = d->n_replicas,
                   .attn_tp = d->attn_tp,
                   .attn_dp = d->attn_dp,
                   .attn_cp = 1,
                   .moe_tp = d->moe_tp,
                   .moe_ep = d->moe_ep,
                   .dense_tp = d->dense_tp,
                   .shared_tp = 1};
    l.moe_dp = d->moe_ep * d->moe_tp > 0 ? d->tp / (d->moe_ep * d->moe_tp) : 0;
    l.world_size = d->tp * d->n_replicas;
    return l;
}

static int ref_group(const struct dims *d, int k, int w, int *members, int *n_members)
{
    int tp = d->tp, moe_dp = tp / (d->moe_ep * d->moe_tp);
    int rep = w / tp, base = rep * tp;
    int lists[64][64], sizes[64], n_lists = 0;
    switch (k) {
    case 0: /* tp */
        for (int i = 0; i < tp; i++) lists[0][i] = base + i;
        sizes[n_lists++] = tp;
        break;
    case 1: /* attention tp: for cp_dp_combined_idx in attn_dp: range(st, en) */
        for (int g = 0; g < d->attn_dp; g++, n_lists++) {
            sizes[n_lists] = d->attn_tp;
            for (int i = 0; i < d->attn_tp; i++) lists[n_lists][i] = base + g * d->attn_tp + i;
        }
        break;
    case 2: /* moe_ep: for moe_dp_idx, moe_tp_idx: range(st, st + ep*mtp, mtp) */
        for (int dp = 0; dp < moe_dp; dp++)
            for (int t = 0; t < d->moe_tp; t++, n_lists++) {
                int st = base + dp * d->moe_ep * d->moe_tp + t;
                sizes[n_lists] = d->moe_ep;
                for (int i = 0; i < d->moe_ep; i++) lists[n_lists][i] = st + i * d->moe_tp;
            }
        break;
    case 3: /* moe_tp: for ep_dp_combined_idx: range(st, st + moe_tp) */
        for (int ed = 0; ed < d->moe_ep * moe_dp; ed++, n_lists++) {
            sizes[n_lists] = d->moe_tp;
            for (int i = 0; i < d->moe_tp; i++) lists[n_lists][i] = base + ed * d->moe_tp + i;
        }
        break;
    case 4: /* dense: contiguous blocks of dense_tp */
        for (int g = 0; g < tp / d->dense_tp; g++, n_lists++) {
            sizes[n_lists] = d->dense_tp;
            for (int i = 0; i < d->dense_tp; i++) lists[n_lists][i] = base + g * d->dense_tp + i;
        }
        break;
    default: /* dp: same tp rank in every replica */
        sizes[0] = d->n_replicas;
        for (int r = 0; r < d->n_replicas; r++) lists[0][r] = r * tp + w % tp;
        n_lists = 1;
        break;
    }
    for (int l = 0; l < n_lists; l++)
        for (int i = 0; i < sizes[l]; i++)
            if (lists[l][i] == w) {
                memcpy(members, lists[l], (size_t)sizes[l] * sizeof(int));
                *n_members = sizes[l];
                return i;
            }
    return -1;
}

TEST(ranks_match_sglang_groups)
{
    static const struct dims cases[] = {
        {8, 1, 8, 8, 1, 1, 1}, {8, 8, 1, 1, 8, 8, 1}, {8, 4, 2, 4, 2, 8, 1},
        {8, 2, 4, 2, 2, 1, 1}, {4, 2, 2, 2, 2, 4, 2}, {2, 1, 2, 2, 1, 2, 3},
        {8, 2, 4, 2, 1, 4, 1}, {1, 1, 1, 1, 1, 1, 4}, {16, 4, 4, 8, 2, 16, 1}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const struct dims *d = &cases[c];
        ms_layout lay = lay_of(d);
        for (int w = 0; w < d->tp * d->n_replicas; w++) {
            ms_rank_coords at;
            int first[MS_GROUP_N], stride[MS_GROUP_N], size[MS_GROUP_N];
            CHECKF(ms_layout_rank_coords(&lay, w, &at) == 0, "case %zu rank %d", c, w);
            for (int k = 0; k < MS_GROUP_N; k++)
                CHECK(ms_layout_group_span(&lay, &at, k, &first[k], &stride[k], &size[k]) == 0);
            int pos_of[6] = {at.tp_rank,     at.attn_tp_rank, at.moe_ep_rank,
                             at.moe_tp_rank, at.dense_rank,   at.replica};
            for (int k = 0; k < 6; k++) {
                int members[64], n = 0;
                int pos = ref_group(d, k, w, members, &n);
                CHECKF(n == size[k], "case %zu rank %d kind %d: size %d, reference %d", c, w, k,
                       size[k], n);
                CHECKF(pos == pos_of[k], "case %zu rank %d kind %d: position %d, reference %d", c,
                       w, k, pos_of[k], pos);
                for (int i = 0; i < n; i++)
                    CHECKF(members[i] == first[k] + i * stride[k],
                           "case %zu rank %d kind %d member %d: %d vs %d", c, w, k, i, members[i],
                           first[k] + i * stride[k]);
            }
            CHECK(at.attn_dp_rank == at.tp_rank / d->attn_tp);
            CHECK(at.moe_dp_rank == at.tp_rank / (d->moe_ep * d->moe_tp));
            CHECK(at.replica * d->tp + at.tp_rank == w);
        }
    }
}

/* Pipeline stages: every group stays inside one stage of one replica, except the DP
 * group, which joins the same stage and tp rank of every replica. */
TEST(groups_with_pp_stages)
{
    ms_layout lay = {.tp = 4,
                     .pp = 2,
                     .n_replicas = 2,
                     .attn_tp = 2,
                     .attn_dp = 2,
                     .attn_cp = 1,
                     .moe_tp = 1,
                     .moe_ep = 4,
                     .moe_dp = 1,
                     .dense_tp = 4,
                     .shared_tp = 1,
                     .world_size = 16};
    for (int w = 0; w < 16; w++) {
        ms_rank_coords at, bt;
        CHECK(ms_layout_rank_coords(&lay, w, &at) == 0);
        CHECK(at.pp_rank == (w / 4) % 2 && at.replica == w / 8 && at.tp_rank == w % 4);
        for (int k = 0; k < MS_GROUP_N; k++) {
            int first, stride, size, mine = 0;
            CHECK(ms_layout_group_span(&lay, &at, k, &first, &stride, &size) == 0);
            for (int i = 0; i < size; i++) {
                CHECK(ms_layout_rank_coords(&lay, first + i * stride, &bt) == 0);
                mine += first + i * stride == w;
                CHECKF(bt.pp_rank == at.pp_rank, "rank %d kind %d: member %d in stage %d", w, k,
                       first + i * stride, bt.pp_rank);
                if (k == MS_GROUP_DP)
                    CHECK(bt.tp_rank == at.tp_rank && bt.replica == i);
                else
                    CHECK(bt.replica == at.replica);
            }
            CHECKF(mine == 1, "rank %d kind %d: not a member of its own group", w, k);
        }
    }
}

TEST(ranks_reject_bad_layouts)
{
    struct dims bad[] = {{4, 2, 3, 1, 1, 1, 1}, {4, 4, 1, 3, 1, 1, 1}, {4, 4, 1, 2, 4, 1, 1},
                         {4, 4, 1, 1, 1, 3, 1}, {0, 1, 1, 1, 1, 1, 1}, {4, 4, 1, 1, 1, 1, 0}};
    ms_rank_coords at;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ms_layout l = lay_of(&bad[i]);
        CHECKF(ms_layout_rank_coords(&l, 0, &at) == MS_EINVAL, "case %zu", i);
    }
    struct dims ok = {4, 2, 2, 2, 2, 1, 2};
    ms_layout l = lay_of(&ok);
    CHECK(ms_layout_rank_coords(&l, 7, &at) == 0);
    CHECK(ms_layout_rank_coords(&l, 8, &at) == MS_EINVAL); /* out of range */
}

/* ---- pure: launching -------------------------------------------------------------------- */

TEST(launch_argv_shape)
{
    char *argv[] = {"moeserve", "serve", "--tp", "4", NULL};
    char *out[32];
    ms_errbuf e;
    unsetenv("MOESERVE_MPIRUN");
    int n = ms_comm_launch_argv(4, "/opt/bin/moeserve", 4, argv, true, out, 32, &e);
    CHECK(n == 11);
    const char *want[] = {"mpirun",
                          "-np",
                          "4",
                          "--oversubscribe",
                          "--bind-to",
                          "none",
                          "--allow-run-as-root",
                          "/opt/bin/moeserve",
                          "serve",
                          "--tp",
                          "4"};
    for (int i = 0; i < n; i++) CHECKF(!strcmp(out[i], want[i]), "arg %d: %s", i, out[i]);
    CHECK(out[n] == NULL);
    n = ms_comm_launch_argv(2, "/x", 4, argv, false, out, 32, &e);
    CHECK(n == 10 && strcmp(out[6], "/x") == 0);
    CHECK(ms_comm_launch_argv(2, "/x", 4, argv, false, out, 5, &e) == MS_ETOOBIG);
    setenv("MOESERVE_MPIRUN", "/usr/bin/mpirun.openmpi", 1);
    n = ms_comm_launch_argv(2, "/x", 1, argv, false, out, 32, &e);
    CHECK(n == 7 && strcmp(out[0], "/usr/bin/mpirun.openmpi") == 0);
    unsetenv("MOESERVE_MPIRUN");
}

TEST(launcher_world_size_checked)
{
    char *argv[] = {"moeserve", NULL};
    ms_errbuf e = {""};
    setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
    CHECK(ms_comm_maybe_relaunch(4, 1, argv, &e) == MS_ELAYOUT);
    CHECKF(strstr(e.msg, "needs 4 ranks, mpirun started 2") != NULL, "%s", e.msg);
    CHECK(ms_comm_maybe_relaunch(2, 1, argv, &e) == 0);
    unsetenv("OMPI_COMM_WORLD_SIZE");
    CHECK(ms_comm_maybe_relaunch(1, 1, argv, &e) == 0); /* singleton: nothing to do */
    CHECK(ms_comm_maybe_relaunch(0, 1, argv, &e) == MS_EINVAL);
    setenv("MOESERVE_RELAUNCHED", "1", 1); /* a relaunch that lost its launcher must not loop */
    CHECK(ms_comm_maybe_relaunch(2, 1, argv, &e) == MS_ECOMM);
    unsetenv("MOESERVE_RELAUNCHED");
}

/* ---- singleton MPI ---------------------------------------------------------------------- */

TEST(not_initialised_fails_cleanly)
{
    ms_errbuf e;
    float x = 1;
    CHECK(!ms_comm_is_init());
    CHECK(ms_comm_world() == NULL && ms_comm_world_size() == 1);
    CHECK(ms_comm_allreduce_f32(NULL, &x, 1, &e) == MS_EINVAL);
    CHECK(ms_comm_deinit(&e) == 0);
}

TEST(singleton_init)
{
    ms_errbuf e = {""};
    ms_comm_opts o;
    ms_comm_opts_default(&o);
    CHECK(o.timeout_s == 60.0 && o.max_sleep_s > 0);
    o.timeout_s = 0;
    CHECK(ms_comm_init(NULL, NULL, &o, &e) == MS_EINVAL);
    o.timeout_s = 5;
    setenv("HWLOC_COMPONENTS", "-pci", 0); /* PCI scan: 20 s under ASan, useless on one host */
    CHECKF(ms_comm_init(NULL, NULL, &o, &e) == 0, "%s", e.msg);
    CHECK(ms_comm_init(NULL, NULL, &o, &e) == MS_EINVAL); /* twice */
    CHECK(ms_comm_is_init() && ms_comm_world_size() == 1 && ms_comm_world_rank() == 0);
    ms_group *w = ms_comm_world();
    CHECK(w && w->size == 1 && w->rank == 0 && !strcmp(w->name, "world"));
    CHECK(ms_comm_group_world_rank(w, 0) == 0 && ms_comm_group_world_rank(w, 1) == -1);
    CHECK(ms_comm_timeout() == 5);
}

TEST(singleton_collectives)
{
    ms_group *w = ms_comm_world();
    ms_errbuf e = {""};
    float v[5] = {1, 2, 3, 4, 5}, out[8] = {0};
    CHECK(ms_comm_allreduce_f32(w, v, 5, &e) == 0 && v[4] == 5);
    CHECK(ms_comm_allreduce_f32(w, v, (size_t)INT_MAX + 1, &e) == MS_ETOOBIG);
    size_t cnt[1] = {5}, dsp[1] = {2}, zero[1] = {0};
    CHECK(ms_comm_allgatherv_f32(w, v, out, cnt, dsp, &e) == 0 && out[2] == 1 && out[6] == 5);
    CHECK(ms_comm_allgatherv_f32(w, v, out, zero, NULL, &e) == 0); /* idle participant */
    unsigned char b[4] = {9, 8, 7, 6}, rb[8] = {0};
    CHECK(ms_comm_allgather(w, b, 4, rb, &e) == 0 && rb[3] == 6);
    CHECK(ms_comm_reduce_scatterv_f32(w, v, out, cnt, &e) == 0 && out[0] == 1 && out[4] == 5);
    CHECK(ms_comm_reduce_scatter_f32(w, v, out, 0, &e) == 0);
    size_t sb[1] = {4};
    memset(rb, 0, sizeof rb);
    CHECK(ms_comm_alltoallv(w, MS_COMM_A2A_DISPATCH, b, sb, NULL, rb, sb, NULL, &e) == 0 &&
          rb[0] == 9);
    CHECK(ms_comm_alltoallv(w, MS_COMM_BCAST, b, sb, NULL, rb, sb, NULL, &e) == MS_EINVAL);
    CHECK(ms_comm_bcast(w, b, 4, 0, &e) == 0);
    CHECK(ms_comm_bcast(w, b, 4, 1, &e) == MS_EINVAL);
    CHECK(strstr(e.msg, "root 1 out of range") != NULL);
    memset(rb, 0, sizeof rb);
    CHECK(ms_comm_gatherv(w, b, 4, rb, sb, NULL, 0, &e) == 0 && rb[1] == 8);
    CHECK(ms_comm_gatherv(w, b, 3, rb, sb, NULL, 0, &e) == MS_EINVAL); /* root's own count */
    CHECK(ms_comm_gather(w, b, 2, rb, 0, &e) == 0 && rb[1] == 8);
    CHECK(ms_comm_barrier(w, &e) == 0);
    /* control blocks: rank 0 of a 1-rank group sends to nobody, and never waits */
    const void *body;
    size_t nb;
    CHECK(ms_comm_ctrl_send(w, b, 4, &e) == 0);
    CHECK(ms_comm_ctrl_recv(w, &body, &nb, &e) == MS_EINVAL);
    CHECK(ms_comm_ctrl_send(w, b, MS_COMM_CTRL_MAX_BYTES + 1, &e) == MS_ETOOBIG);
}

TEST(singleton_accounting)
{
    ms_group *w = ms_comm_world();
    ms_errbuf e;
    ms_comm_stats_reset(NULL);
    CHECK(ms_comm_set_tag(-2) == MS_EINVAL && ms_comm_set_tag(MS_COMM_MAX_TAG + 1) == MS_EINVAL);
    CHECK(ms_comm_set_tag(MS_COMM_MAX_TAG) == 0 && ms_comm_tag() == MS_COMM_MAX_TAG);
    float v[6] = {0};
    CHECK(ms_comm_allreduce_f32(w, v, 6, &e) == 0);
    CHECK(ms_comm_set_tag(3) == 0);
    CHECK(ms_comm_allreduce_f32(w, v, 2, &e) == 0);
    CHECK(ms_comm_bcast(w, v, 24, 0, &e) == 0);
    ms_comm_set_tag(MS_COMM_TAG_NONE);
    ms_comm_counter c;
    ms_comm_stats_get(w, MS_COMM_MAX_TAG, MS_COMM_ALLREDUCE, &c);
    CHECK(c.n_calls == 1 && c.payload_bytes == 24 && c.sent_bytes == 0 && c.recv_bytes == 0);
    ms_comm_stats_get(w, 3, MS_COMM_ALLREDUCE, &c);
    CHECK(c.n_calls == 1 && c.payload_bytes == 8);
    ms_comm_stats_get(w, MS_COMM_TAG_ALL, MS_COMM_ALLREDUCE, &c);
    CHECK(c.n_calls == 2 && c.payload_bytes == 32);
    ms_comm_stats_get(w, 3, MS_COMM_BCAST, &c);
    CHECK(c.n_calls == 1 && c.payload_bytes == 24 && c.sent_bytes == 0); /* no peers */
    ms_comm_stats_get(w, 4, MS_COMM_BCAST, &c);
    CHECK(c.n_calls == 0);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    ms_comm_stats_print(f);
    fclose(f);
    CHECKF(strstr(text, "group=world tag=3 kind=allreduce calls=1 payload=8 sent=0 recv=0") != NULL,
           "%s", text);
    free(text);
    ms_comm_stats_reset(w);
    ms_comm_stats_get(w, MS_COMM_TAG_ALL, MS_COMM_ALLREDUCE, &c);
    CHECK(c.n_calls == 0);
    CHECK(!strcmp(ms_comm_kind_name(MS_COMM_A2A_COMBINE), "a2a_combine"));
}

TEST(singleton_groups)
{
    ms_group *w = ms_comm_world(), *g = NULL;
    ms_errbuf e = {""};
    CHECK(ms_comm_split(w, -1, 0, "none", &g, &e) == 0 && g == NULL);
    CHECK(ms_comm_split(w, 3, 0, "solo", &g, &e) == 0 && g && g->size == 1);
    CHECK(!strcmp(g->name, "solo") && ms_comm_group_world_rank(g, 0) == 0);
    float x = 2;
    CHECK(ms_comm_allreduce_f32(g, &x, 1, &e) == 0 && x == 2);
    ms_comm_group_free(g);
    ms_comm_group_free(NULL);
    ms_comm_group_free(w); /* ignored: the world is owned by the layer */
    ms_comm_groups gs;
    struct dims d = {1, 1, 1, 1, 1, 1, 1};
    ms_layout l1 = lay_of(&d);
    CHECKF(ms_comm_groups_init(&gs, &l1, &e) == 0, "%s", e.msg);
    CHECK(gs.tp->size == 1 && gs.moe_ep->size == 1 && gs.dp->size == 1 && gs.world == w);
    CHECK(!strcmp(gs.moe_ep->name, "moe_ep"));
    ms_comm_groups_deinit(&gs);
    struct dims two = {2, 1, 2, 2, 1, 1, 1};
    ms_layout l2 = lay_of(&two);
    CHECK(ms_comm_groups_init(&gs, &l2, &e) == MS_ELAYOUT);
    CHECKF(strstr(e.msg, "needs 2 ranks") != NULL, "%s", e.msg);
}

static void *off_thread(void *arg)
{
    ms_errbuf e;
    *(int *)arg = ms_comm_barrier(ms_comm_world(), &e);
    return NULL;
}

TEST(funneled_rejects_other_threads)
{
    int rc = 0;
    pthread_t t;
    CHECK(pthread_create(&t, NULL, off_thread, &rc) == 0);
    pthread_join(t, NULL);
    CHECK(rc == MS_EINTERNAL);
}

TEST(singleton_deinit)
{
    ms_errbuf e = {""};
    ms_group *g = NULL;
    CHECK(ms_comm_split(ms_comm_world(), 0, 0, "kept", &g, &e) == 0 && g);
    CHECKF(ms_comm_deinit(&e) == 0, "%s", e.msg);
    CHECK(!ms_comm_is_init() && ms_comm_world() == NULL);
    float x = 1;
    CHECK(ms_comm_allreduce_f32(g, &x, 1, &e) == MS_EINVAL); /* group outlived the layer */
    ms_comm_group_free(g);
    CHECK(ms_comm_deinit(&e) == 0);
}

int main(void)
{
    RUN(ranks_match_sglang_groups);
    RUN(groups_with_pp_stages);
    RUN(ranks_reject_bad_layouts);
    RUN(launch_argv_shape);
    RUN(launcher_world_size_checked);
    RUN(not_initialised_fails_cleanly);
    RUN(singleton_init);
    RUN(singleton_collectives);
    RUN(singleton_accounting);
    RUN(singleton_groups);
    RUN(funneled_rejects_other_threads);
    RUN(singleton_deinit);
    return TEST_REPORT();
}
