/* eplb_run.c — EPLB at run time (--enable-eplb; DESIGN.md §8; SGLang's EPLBManager and
 * ExpertLocationUpdater): every --eplb-rebalance-num-iterations forward passes, the
 * recorder's window (logical counts summed over all ranks) goes through DeepSeek's
 * balancer with the start-up placement's policy (parallel/eplb.h), unless the average
 * balancedness of the last passes is above --eplb-min-rebalancing-utilization-threshold
 * (SGLang: skip when avg > threshold; 1.0, the default, never skips); then the routed
 * layers move to the new placement, all at once or --eplb-rebalance-layers-per-chunk
 * per forward pass (the first chunk one pass after the plan, as SGLang yields before
 * each chunk when there are several).  An expert a rank keeps stays in its slot
 * (vLLM's preserve_intragpu_slots; SGLang moves it), so only the rank's new experts
 * move.
 *
 * Moving one layer, on every rank of the EP group together, between two forwards: each
 * slot whose expert changes gets the new expert's bytes from a slot of this rank that
 * holds it (a local copy), else from the rank holding its first replica in the old
 * placement (MPI point-to-point, ms_comm_exchange); everything lands in a staging
 * buffer of one layer's slots first (old slots are still being sent), then is written
 * into the slots (model/expert_slots.c refreshes their derived copies), and only then
 * does the layer's map change, on every rank at the same step boundary: no forward
 * sees a half-moved layer.  The staging buffer is counted in the KV budget.
 * Owns the cadence, the plan and the staging buffer; not the maps (the engine's) or the
 * slots (the model's).  Main thread, every rank.
 */
#include "serve/eplb_run.h"
#include "serve/engine_priv.h"

#include "base/log.h"
#include "base/util.h"
#include "moe/expert_recorder.h"
#include "parallel/eplb.h"

#include <stdlib.h>
#include <string.h>

struct ms_eplb_run {
    int n_iters, per_chunk, policy;
    double threshold;
    int L, E, R, n_ranks, me, per_rank;
    int64_t passes;  /* forward passes since the last plan */
    int64_t pass_id; /* forward passes since start-up */
    int32_t *plan;   /* [L][R] the placement being moved to; NULL: none */
    int next_layer;  /* first layer not moved yet */
    double t_start;
    int64_t *lc;      /* [L][E] the window's counts */
    float *w;         /* [L][E] */
    uint8_t *staging; /* [per_rank][max slot bytes] */
    size_t staging_bytes;
    ms_comm_p2p *ops; /* [2 · R] */
    int32_t *scr;     /* [E + 2 · per_rank] keep_slots' */
    int64_t decisions, rebalances, skipped, slots_moved, slots_received;
};

static void run_free(struct ms_eplb_run *r)
{
    if (!r) return;
    free(r->plan);
    free(r->lc);
    free(r->w);
    ms_free_aligned(r->staging);
    free(r->ops);
    free(r->scr);
    free(r);
}

void ms_eplb_run_free(ms_engine *e)
{
    run_free(e->eplb);
    e->eplb = NULL;
}

size_t ms_eplb_run_staging_bytes(const ms_engine *e)
{
    return e->eplb ? e->eplb->staging_bytes : 0;
}
size_t ms_engine_eplb_staging_bytes(const ms_engine *e)
{
    return ms_eplb_run_staging_bytes(e);
}

void ms_engine_eplb_progress(const ms_engine *e, ms_engine_eplb_state *st)
{
    const struct ms_eplb_run *r = e->eplb;
    *st = (ms_engine_eplb_state){
        .decisions = r ? r->decisions : 0, .skipped = r ? r->skipped : 0, .moving = r && r->plan};
}

int ms_eplb_run_open(ms_engine *e, ms_errbuf *err)
{
    const ms_launch *la = &e->o.launch;
    if (!la->enable_eplb) return 0;
    const ms_model_shape *sh = ms_model_shape_of(e->m);
    if (e->n_expert_maps <= 0 || sh->n_routed <= 0)
        return ms_err(err, MS_EUNSUPPORTED,
                      "--enable-eplb on a dense model: no experts to balance");
    if (e->lay.moe_ep <= 1)
        return ms_err(err, MS_EUNSUPPORTED,
                      "--enable-eplb at EP %d: nothing to balance with one "
                      "EP rank (use --ep-size > 1 with --moe-a2a-backend)",
                      e->lay.moe_ep);
    if (e->lay.sparse_mode != MS_MLP_SCATTERED)
        return ms_err(err, MS_EUNSUPPORTED,
                      "--enable-eplb: moving experts needs the all-to-all "
                      "MoE path (--moe-a2a-backend deepep|mpi|...)");
    struct ms_eplb_run *r = calloc(1, sizeof *r);
    if (!r) return ms_err(err, MS_ENOMEM, "out of memory");
    const ms_expert_map *m0 = &e->expert_maps[0];
    *r = (struct ms_eplb_run){.n_iters = la->eplb_rebalance_num_iterations,
                              .per_chunk = la->eplb_rebalance_layers_per_chunk,
                              .policy = la->eplb_algorithm,
                              .threshold = la->eplb_min_utilization,
                              .L = sh->n_layers,
                              .E = m0->n_logical,
                              .R = m0->n_physical,
                              .n_ranks = m0->n_ranks,
                              .me = e->shard.at.moe_ep_rank,
                              .per_rank = m0->per_rank};
    e->eplb = r;
    size_t max_slot = 0;
    for (int l = 0; l < r->L; l++) {
        if (!ms_model_expert_slots(e->m, l)) continue;
        size_t b = ms_model_expert_slot_bytes(e->m, l);
        if (!b)
            return ms_err(err, MS_EUNSUPPORTED,
                          "--enable-eplb: the weights are read from the "
                          "file mapping (MOESERVE_WEIGHTS=mmap): expert slots cannot be rewritten");
        max_slot = MS_MAX(max_slot, b);
    }
    if (!max_slot)
        return ms_err(err, MS_EUNSUPPORTED,
                      "--enable-eplb: runtime expert moves are not built "
                      "for the %s family (its experts have no rewritable slots)",
                      ms_model_family(e->m)->name);
    r->staging_bytes = max_slot * (size_t)r->per_rank;
    r->staging = ms_alloc_aligned(r->staging_bytes, 1);
    r->lc = malloc(sizeof(int64_t) * (size_t)r->L * (size_t)r->E);
    r->w = malloc(sizeof(float) * (size_t)r->L * (size_t)r->E);
    r->ops = malloc(sizeof *r->ops * (size_t)(2 * r->R));
    r->scr = malloc(sizeof(int32_t) * (size_t)(r->E + 2 * r->per_rank));
    if (!r->staging || !r->lc || !r->w || !r->ops || !r->scr)
        return ms_err(err, MS_ENOMEM, "out of memory for EPLB's %.1f MiB staging buffer",
                      (double)r->staging_bytes / (1 << 20));
    if (e->shard.tp_group->rank != r->me || e->shard.tp_group->size != r->n_ranks)
        return ms_err(err, MS_EINTERNAL, "EP rank %d of %d is group rank %d of %d", r->me,
                      r->n_ranks, e->shard.tp_group->rank, e->shard.tp_group->size);
    if (e->rank == 0)
        MS_LOG(MS_INFO, "eplb",
               "[EPLBManager] rebalance every %d forward passes (%s), %s per pass, skip above "
               "balancedness %.3f; staging buffer %.1f MiB (one layer's %d slots)",
               r->n_iters, ms_eplb_policy_name(r->policy),
               r->per_chunk > 0 ? "layers in chunks" : "all layers", r->threshold,
               (double)r->staging_bytes / (1 << 20), r->per_rank);
    return 0;
}

/* The slot of this rank's old placement holding logical e (-1: none). */
static int local_holder(const int32_t *old, int me, int per_rank, int e)
{
    for (int s = 0; s < per_rank; s++)
        if (old[me * per_rank + s] == e) return s;
    return -1;
}

static int first_replica(const int32_t *old, int R, int e)
{
    for (int p = 0; p < R; p++)
        if (old[p] == e) return p;
    return -1;
}

/* Moves layer l to the placement row want[R] (every rank of the EP group together). */
static int move_layer(ms_engine *e, struct ms_eplb_run *r, int l, const int32_t *want,
                      ms_errbuf *err)
{
    ms_expert_map *map = &e->expert_maps[l];
    const int32_t *old = map->logical_of;
    int R = r->R, pr = r->per_rank, me = r->me, n_ops = 0, n_local = 0, n_recv = 0, rc;
    size_t sb = ms_model_expert_slot_bytes(e->m, l);
    if (!memcmp(old, want, sizeof(int32_t) * (size_t)R)) return 0;
    if (!sb || ms_model_expert_slots(e->m, l) != pr)
        return ms_err(err, MS_EINTERNAL, "layer %d: %d slots of %zu bytes, the map has %d per rank",
                      l, ms_model_expert_slots(e->m, l), sb, pr);
    for (int p = 0; p < R; p++) {
        int dst = p / pr, s = p % pr, x = want[p];
        if (old[p] == x) continue;
        int src_p = first_replica(old, R, x);
        if (src_p < 0)
            return ms_err(err, MS_EINTERNAL, "layer %d: expert %d has no old slot", l, x);
        int src = src_p / pr;
        if (dst == me) {
            int ls = local_holder(old, me, pr, x);
            if (ls >= 0) { /* a copy of this rank's own (old) slot */
                memcpy(r->staging + (size_t)s * sb, ms_model_expert_slot_blob(e->m, l, ls), sb);
                n_local++;
            } else {
                r->ops[n_ops++] = (ms_comm_p2p){
                    .peer = src, .is_recv = 1, .buf = r->staging + (size_t)s * sb, .bytes = sb};
                n_recv++;
            }
        } else if (src == me && local_holder(old, dst, pr, x) < 0) {
            r->ops[n_ops++] =
                (ms_comm_p2p){.peer = dst,
                              .buf = (void *)ms_model_expert_slot_blob(e->m, l, src_p % pr),
                              .bytes = sb};
        }
    }
    if ((rc = ms_comm_exchange(e->shard.tp_group, r->ops, n_ops, err))) return rc;
    for (int s = 0; s < pr; s++)
        if (old[me * pr + s] != want[me * pr + s] &&
            (rc = ms_model_expert_slot_write(e->m, l, s, r->staging + (size_t)s * sb, err)))
            return rc;
    ms_expert_map nm;
    if ((rc = ms_expert_map_init_replicas(&nm, r->E, R, r->n_ranks, me, (uint64_t)l, want, err)))
        return rc;
    if (e->rec) ms_expert_recorder_lock(e->rec);
    memcpy(map->logical_of, nm.logical_of, sizeof(int32_t) * (size_t)R);
    memcpy(map->physical_of, nm.physical_of, sizeof(int32_t) * (size_t)r->E);
    if (e->rec) ms_expert_recorder_unlock(e->rec);
    ms_expert_map_deinit(&nm);
    ms_model_expert_slots_bind(e->m, l);
    r->slots_moved += n_local + n_recv;
    r->slots_received += n_recv;
    if (e->rank == 0)
        MS_LOG(MS_INFO, "eplb",
               "[EPLBManager] layer %d moved at forward pass %lld: %d slots on "
               "rank 0 (%d received, %d copied locally), %d transfers sent or received",
               l, (long long)r->pass_id, n_local + n_recv, n_recv, n_local, n_ops);
    return 0;
}

/* The next chunk of routed layers of the pending plan; the plan ends after the last. */
static int move_chunk(ms_engine *e, struct ms_eplb_run *r, ms_errbuf *err)
{
    int moved = 0, rc;
    while (r->next_layer < r->L && (r->per_chunk <= 0 || moved < r->per_chunk)) {
        int l = r->next_layer++;
        if (!ms_model_expert_slots(e->m, l)) continue; /* dense: nothing routed */
        if ((rc = move_layer(e, r, l, r->plan + (size_t)l * r->R, err))) return rc;
        moved++;
    }
    if (r->next_layer < r->L) return 0;
    free(r->plan);
    r->plan = NULL;
    r->rebalances++;
    if (e->rec) { /* passes recorded while layers moved mixed two placements */
        ms_expert_recorder_take_window(e->rec, r->lc);
    }
    if (e->rank == 0)
        MS_LOG(MS_INFO, "eplb",
               "[EPLBManager] rebalance end at forward pass %lld time=%.3fs "
               "(%lld done, %lld skipped; rank 0 rewrote %lld slots, %lld received)",
               (long long)r->pass_id, ms_now_s() - r->t_start, (long long)r->rebalances,
               (long long)r->skipped, (long long)r->slots_moved, (long long)r->slots_received);
    return 0;
}

/* Within each rank, an expert the rank keeps stays in its old slot (vLLM's
 * preserve_intragpu_slots): the rank's set of experts, and so the balance, is the
 * balancer's; only the order of its slots changes, so fewer bytes move.
 * scr: [E + 2 · per_rank]. */
static void keep_slots(int32_t *row, const int32_t *old, int n_ranks, int per_rank, int E,
                       int32_t *scr)
{
    int32_t *cnt = scr, *out = scr + E, *lst = out + per_rank;
    for (int r = 0; r < n_ranks; r++) {
        int32_t *nw = row + (size_t)r * per_rank;
        const int32_t *od = old + (size_t)r * per_rank;
        memset(cnt, 0, sizeof(int32_t) * (size_t)E);
        for (int s = 0; s < per_rank; s++) cnt[nw[s]]++;
        for (int s = 0; s < per_rank; s++) { /* kept where it was */
            out[s] = cnt[od[s]] > 0 ? od[s] : -1;
            if (out[s] >= 0) cnt[od[s]]--;
        }
        int k = 0, j = 0;
        for (int s = 0; s < per_rank; s++) /* the rest, in the balancer's order */
            if (cnt[nw[s]] > 0) cnt[nw[s]]--, lst[k++] = nw[s];
        for (int s = 0; s < per_rank; s++)
            if (out[s] < 0) out[s] = lst[j++];
        memcpy(nw, out, sizeof(int32_t) * (size_t)per_rank);
    }
}

/* The plan from the recorded window (every rank computes the same one from the same
 * all-rank sums). */
static int make_plan(ms_engine *e, struct ms_eplb_run *r, ms_errbuf *err)
{
    r->decisions++;
    int n = ms_expert_recorder_take_window(e->rec, r->lc);
    ms_recorder_stats st;
    ms_expert_recorder_stats(e->rec, &st);
    if (st.avg1000 > r->threshold) {
        r->skipped++;
        if (e->rank == 0)
            MS_LOG(MS_INFO, "eplb",
                   "[EPLBManager] Skipped ep rebalancing: current GPU "
                   "utilization %.3f > minimum rebalance threshold %.3f",
                   st.avg1000, r->threshold);
        return 0;
    }
    int64_t total = 0;
    for (size_t i = 0; i < (size_t)r->L * r->E; i++) r->w[i] = (float)r->lc[i], total += r->lc[i];
    if (!total) return 0; /* nothing routed in the window */
    ms_eplb_plan pl;
    int rc = ms_eplb_rebalance(r->w, r->L, r->E, r->R, 1, 1, r->n_ranks, r->policy, &pl, err);
    if (rc) return rc;
    r->plan = pl.phy2log;
    pl.phy2log = NULL;
    ms_eplb_plan_free(&pl);
    for (int l = 0; l < r->L; l++) {
        int64_t s = 0;
        for (int x = 0; x < r->E; x++) s += r->lc[(size_t)l * r->E + x];
        int32_t *row = r->plan + (size_t)l * r->R;
        const int32_t *old = e->expert_maps[l].logical_of;
        if (!s) /* a layer with nothing recorded keeps its placement */
            memcpy(row, old, sizeof(int32_t) * (size_t)r->R);
        else
            keep_slots(row, old, r->n_ranks, r->per_rank, r->E, r->scr);
    }
    r->next_layer = 0;
    r->t_start = ms_now_s();
    if (e->rank == 0)
        MS_LOG(MS_INFO, "eplb",
               "[EPLBManager] rebalance start at forward pass %lld: window of "
               "%d passes, average balancedness %.3f",
               (long long)r->pass_id, n, st.avg1000);
    return 0;
}

int ms_eplb_run_step(ms_engine *e, ms_errbuf *err)
{
    struct ms_eplb_run *r = e->eplb;
    if (!r) return 0;
    r->pass_id++;
    if (r->plan) return move_chunk(e, r, err);
    if (++r->passes < r->n_iters) return 0;
    r->passes = 0;
    int rc = make_plan(e, r, err);
    if (rc || !r->plan) return rc;
    return r->per_chunk > 0 ? 0 : move_chunk(e, r, err); /* one chunk: at once */
}
