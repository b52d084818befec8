/* ep.c — the expert map and the all-to-all dispatch / combine (ep.h).  A dispatched
 * record: source row, entry count, then K (physical id, weight) pairs (-1 where the
 * entry is another rank's), fused one more (SHARED_ID: the shared expert, -1: not
 * here), and the hidden row in FP32 or BF16. */
#include "parallel/ep.h"

#include "base/util.h"
#include "kernels/dtype.h"
#include "kernels/kernels.h"
#include "parallel/eplb.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

int ms_expert_map_init_from(ms_expert_map *m, int n_logical, int n_ranks, const int32_t *logical_of,
                            ms_errbuf *err)
{
    memset(m, 0, sizeof *m);
    if (n_logical < 1 || n_ranks < 1 || n_logical % n_ranks)
        return ms_err(err, MS_EINVAL, "%d experts cannot be split over %d EP ranks", n_logical,
                      n_ranks);
    m->n_logical = m->n_physical = n_logical;
    m->n_ranks = n_ranks;
    m->per_rank = n_logical / n_ranks;
    m->logical_of = malloc(sizeof(int32_t) * (size_t)n_logical);
    m->physical_of = malloc(sizeof(int32_t) * (size_t)n_logical);
    if (!m->logical_of || !m->physical_of) {
        ms_expert_map_deinit(m);
        return ms_err(err, MS_ENOMEM, "out of memory");
    }
    for (int e = 0; e < n_logical; e++) m->physical_of[e] = -1;
    for (int p = 0; p < n_logical; p++) {
        int e = logical_of ? logical_of[p] : p;
        if (e < 0 || e >= n_logical || m->physical_of[e] >= 0) {
            ms_expert_map_deinit(m);
            return ms_err(err, MS_EINVAL,
                          "physical expert %d holds logical expert %d: each of the %d logical "
                          "experts must appear exactly once (redundant replicas need EPLB)",
                          p, e, n_logical);
        }
        m->logical_of[p] = e;
        m->physical_of[e] = p;
    }
    return 0;
}

int ms_expert_map_init_identity(ms_expert_map *m, int n_logical, int n_ranks, ms_errbuf *err)
{
    return ms_expert_map_init_from(m, n_logical, n_ranks, NULL, err);
}

void ms_expert_map_deinit(ms_expert_map *m)
{
    if (!m) return;
    free(m->logical_of);
    free(m->physical_of);
    memset(m, 0, sizeof *m);
}

/* SGLang's fair choice for one logical expert: the c replicas reps[] spread over the
 * k ranks holding none; returns the one for the j-th such rank. */
static int32_t fair_choice(const int32_t *reps, int c, int k, int j, uint64_t seed, int32_t *buf)
{
    int n = 0;
    for (int w = 0; w < k / c; w++)
        for (int i = 0; i < c; i++) buf[n++] = reps[i];
    uint64_t st = seed * 0x9e3779b97f4a7c15ull + 42;
    int32_t *pool = buf + k; /* a sample of k mod c replicas without replacement */
    for (int i = 0; i < c; i++) pool[i] = reps[i];
    for (int i = 0; i < k % c; i++) {
        int r = i + (int)(ms_rng_next(&st) % (uint64_t)(c - i));
        int32_t t = pool[i];
        pool[i] = pool[r], pool[r] = t;
        buf[n++] = pool[i];
    }
    for (int i = n - 1; i > 0; i--) { /* shuffle */
        int r = (int)(ms_rng_next(&st) % (uint64_t)(i + 1));
        int32_t t = buf[i];
        buf[i] = buf[r], buf[r] = t;
    }
    return buf[j];
}

int ms_expert_map_init_replicas(ms_expert_map *m, int n_logical, int n_physical, int n_ranks,
                                int me, uint64_t seed, const int32_t *logical_of, ms_errbuf *err)
{
    memset(m, 0, sizeof *m);
    if (n_logical < 1 || n_ranks < 1 || n_physical < n_logical || n_physical % n_ranks || me < 0 ||
        me >= n_ranks)
        return ms_err(err, MS_EINVAL,
                      "%d physical slots for %d experts cannot be split over "
                      "%d EP ranks",
                      n_physical, n_logical, n_ranks);
    m->n_logical = n_logical, m->n_physical = n_physical, m->n_ranks = n_ranks;
    m->per_rank = n_physical / n_ranks;
    m->logical_of = malloc(sizeof(int32_t) * (size_t)n_physical);
    m->physical_of = malloc(sizeof(int32_t) * (size_t)n_logical);
    int32_t *reps = malloc(sizeof(int32_t) * (size_t)n_physical);
    int32_t *buf = malloc(sizeof(int32_t) * (size_t)(n_ranks + n_physical));
    int rc = 0;
    if (!m->logical_of || !m->physical_of || !reps || !buf) {
        rc = ms_err(err, MS_ENOMEM, "out of memory");
        goto out;
    }
    for (int p = 0; p < n_physical; p++) {
        int e = logical_of[p];
        if (e < 0 || e >= n_logical) {
            rc = ms_err(err, MS_EINVAL,
                        "physical expert %d holds %d: not one of the %d logical "
                        "experts",
                        p, e, n_logical);
            goto out;
        }
        m->logical_of[p] = e;
    }
    for (int e = 0; e < n_logical; e++) {
        int c = 0, mine = -1, k = 0, j = -1;
        for (int p = 0; p < n_physical; p++)
            if (logical_of[p] == e) {
                reps[c++] = p;
                if (mine < 0 && p / m->per_rank == me) mine = p;
            }
        if (!c) {
            rc = ms_err(err, MS_EINVAL, "logical expert %d has no physical slot", e);
            goto out;
        }
        if (mine >= 0) {
            m->physical_of[e] = mine;
            continue;
        }
        for (int r = 0; r < n_ranks; r++) { /* the ranks holding no copy, ascending */
            int holds = 0;
            for (int i = 0; i < c; i++) holds |= reps[i] / m->per_rank == r;
            if (!holds) {
                if (r == me) j = k;
                k++;
            }
        }
        m->physical_of[e] = fair_choice(reps, c, k, j, seed * 1000003u + (uint64_t)e, buf);
    }
out:
    free(reps);
    free(buf);
    if (rc) ms_expert_map_deinit(m);
    return rc;
}

/* One layer's placement from DeepSeek's EPLB on recorded loads w[L][E]. */
static int maps_from_counts(ms_expert_map *maps, int n_layers, int E, int R, int n_ranks, int me,
                            int policy, const char *path, ms_errbuf *err)
{
    float *w = NULL;
    int L = 0, E2 = 0, rc;
    if ((rc = ms_eplb_load_counts(path, &w, &L, &E2, err))) {
        ms_errbuf e2 = *err;
        return ms_err(err, rc, "--init-expert-location %s", e2.msg);
    }
    if (E2 != E) {
        free(w);
        return ms_err(err, MS_EINVAL,
                      "--init-expert-location %s: %d experts per layer, the "
                      "model has %d",
                      path, E2, E);
    }
    ms_eplb_plan pl;
    ms_errbuf e2 = {{0}};
    if ((rc = ms_eplb_rebalance(w, L, E, R, 1, 1, n_ranks, policy, &pl, &e2))) {
        free(w);
        return ms_err(err, rc, "--init-expert-location %s: %s", path, e2.msg);
    }
    int32_t *triv = malloc(sizeof(int32_t) * (size_t)R);
    for (int l = 0; l < n_layers && !rc; l++) {
        const int32_t *row = l < L ? pl.phy2log + (size_t)l * R : triv;
        if (!triv)
            rc = ms_err(err, MS_ENOMEM, "out of memory");
        else {
            for (int p = 0; p < R; p++) triv[p] = p % E;
            rc = ms_expert_map_init_replicas(&maps[l], E, R, n_ranks, me, (uint64_t)l, row, err);
        }
    }
    free(triv);
    ms_eplb_plan_free(&pl);
    free(w);
    return rc;
}

int ms_expert_map_load(ms_expert_map *maps, int n_layers, int n_logical, int n_physical,
                       int n_ranks, int me, int policy, const char *path, ms_errbuf *err)
{
    for (int l = 0; l < n_layers; l++) memset(&maps[l], 0, sizeof maps[l]);
    int R = n_physical, E = n_logical, rc = 0;
    int32_t *row = malloc(sizeof(int32_t) * (size_t)(R > 0 ? R : 1));
    json_t *root = NULL;
    if (!row) return ms_err(err, MS_ENOMEM, "out of memory");
    for (int p = 0; p < R; p++) row[p] = p % (E > 0 ? E : 1);
    if (!path || !path[0]) { /* trivial */
        for (int l = 0; l < n_layers && !rc; l++)
            rc = ms_expert_map_init_replicas(&maps[l], E, R, n_ranks, me, (uint64_t)l, row, err);
        goto out;
    }
    json_error_t je;
    root = json_load_file(path, 0, &je);
    if (!root) {
        rc = ms_err(err, MS_EINVAL, "--init-expert-location %s: %s (line %d)", path, je.text,
                    je.line);
        goto out;
    }
    json_t *rows = json_object_get(root, "physical_to_logical_map");
    if (json_is_array(root) || json_object_get(root, "logical_count")) {
        rc = maps_from_counts(maps, n_layers, E, R, n_ranks, me, policy, path, err);
        goto out;
    }
    if (!json_is_array(rows) || (int)json_array_size(rows) > n_layers) {
        rc = ms_err(err, MS_EINVAL,
                    "--init-expert-location %s: needs \"physical_to_logical_map\", an array of at "
                    "most %d layers (one row of physical experts each), or a recorded "
                    "\"logical_count\"",
                    path, n_layers);
        goto out;
    }
    for (int l = 0; l < n_layers && !rc; l++) {
        json_t *r = json_array_get(rows, (size_t)l);
        if (!r) {
            for (int p = 0; p < R; p++) row[p] = p % E;
        } else if (!json_is_array(r) || (int)json_array_size(r) != R) {
            rc = ms_err(err, MS_EINVAL,
                        "--init-expert-location %s: layer %d has %zu physical experts, the launch "
                        "%d (%d routed + --ep-num-redundant-experts %d)",
                        path, l, json_is_array(r) ? json_array_size(r) : 0, R, E, R - E);
            break;
        } else {
            for (int p = 0; p < R; p++) {
                json_t *v = json_array_get(r, (size_t)p);
                row[p] =
                    json_is_integer(v) && json_integer_value(v) >= 0 && json_integer_value(v) < E
                        ? (int32_t)json_integer_value(v)
                        : -1;
            }
        }
        ms_errbuf e2 = {{0}};
        if ((rc = R == E ? ms_expert_map_init_from(&maps[l], E, n_ranks, row, &e2)
                         : ms_expert_map_init_replicas(&maps[l], E, R, n_ranks, me, (uint64_t)l,
                                                       row, &e2)))
            ms_err(err, rc, "--init-expert-location %s: layer %d: %s", path, l, e2.msg);
    }
out:
    free(row);
    json_decref(root);
    if (rc)
        for (int l = 0; l < n_layers; l++) ms_expert_map_deinit(&maps[l]);
    return rc;
}

void ms_ep_ws_free(ms_ep_ws *ws)
{
    if (!ws) return;
    free(ws->sbuf);
    free(ws->rbuf);
    free(ws->rec_row);
    free(ws->counts);
    free(ws->cnt_all);
    ms_free_aligned(ws->cbuf);
    free(ws->rshared);
    memset(ws, 0, sizeof *ws);
}

static size_t record_bytes(int K, int64_t D, int bf16)
{
    size_t b = 8 + (size_t)K * 8 + (size_t)D * (bf16 ? 2 : 4);
    return (b + 7) & ~(size_t)7;
}

enum { SHARED_ID = -2 }; /* the pair of a record that carries the shared expert */

int ms_ep_dispatch(ms_group *g, const ms_expert_map *map, const float *x, int64_t n, int64_t D,
                   int K, const int32_t *idx, const float *w, const ms_ep_shared *shared, int bf16,
                   ms_ep_ws *ws, float **xr, int64_t *cap_xr, int32_t **ir, int64_t *cap_ir,
                   float **wr, int64_t *cap_wr, int64_t *n_recv_out, ms_errbuf *err)
{
    int N = g->size, me = g->rank, rc;
    const int fused = shared && shared->fused, KP = K + fused; /* pairs per record */
    const int32_t *sdst = fused ? shared->dst : NULL;
    if (K + 1 > 64) return ms_err(err, MS_EINTERNAL, "top-%d routing: at most 63 entries", K);
    for (int64_t t = 0; fused && t < n; t++)
        if (sdst[t] < 0 || sdst[t] >= N)
            return ms_err(err, MS_EINTERNAL, "shared expert of row %lld sent to EP rank %d",
                          (long long)t, sdst[t]);
    if (N > MS_EP_MAX_RANKS)
        return ms_err(err, MS_EUNSUPPORTED, "more than %d EP ranks", MS_EP_MAX_RANKS);
    if (map->n_ranks != N)
        return ms_err(err, MS_EINTERNAL, "expert map for %d EP ranks used on %d", map->n_ranks, N);
    if (N > ws->cap_world) {
        free(ws->counts);
        free(ws->cnt_all);
        ws->counts = calloc((size_t)N * 4, sizeof(size_t));
        ws->cnt_all = calloc((size_t)N * (size_t)N, sizeof(int64_t));
        if (!ws->counts || !ws->cnt_all) return ms_err(err, MS_ENOMEM, "out of memory");
        ws->cap_world = N;
    }
    size_t *sbytes = ws->counts, *sdisp = sbytes + N, *rbytes = sdisp + N, *rdisp = rbytes + N;
    int64_t cnt[MS_EP_MAX_RANKS];
    memset(cnt, 0, sizeof(int64_t) * (size_t)N);
    /* destinations of each row, deduplicated: the owners of its entries' replicas */
    for (int64_t t = 0; t < n; t++) {
        uint8_t seen[MS_EP_MAX_RANKS / 8] = {0};
        for (int k = 0; k < K; k++) {
            int e = idx[t * K + k];
            if (e < 0 || e >= map->n_logical)
                return ms_err(err, MS_EINTERNAL, "expert %d has no owner", e);
            int d = ms_expert_map_owner(map, map->physical_of[e]);
            if (!(seen[d / 8] & (1u << (d % 8)))) {
                seen[d / 8] |= (uint8_t)(1u << (d % 8));
                cnt[d]++;
            }
        }
        if (fused && !(seen[sdst[t] / 8] & (1u << (sdst[t] % 8)))) cnt[sdst[t]]++;
    }
    size_t R = record_bytes(KP, D, bf16);
    int64_t n_send = 0;
    for (int d = 0; d < N; d++) {
        sdisp[d] = (size_t)n_send * R;
        sbytes[d] = (size_t)cnt[d] * R;
        n_send += cnt[d];
        if (d != me) ws->dispatch_rows += cnt[d];
    }
    if (ms_grow_array((void **)&ws->sbuf, &ws->cap_sbuf, n_send * (int64_t)R + 8, 1) ||
        ms_grow_array((void **)&ws->rec_row, &ws->cap_rec_row, n_send + 1, sizeof(int32_t)))
        return ms_err(err, MS_ENOMEM, "out of memory in dispatch");
    int64_t fill[MS_EP_MAX_RANKS];
    for (int d = 0; d < N; d++) fill[d] = (int64_t)(sdisp[d] / R);
    for (int64_t t = 0; t < n; t++) {
        int dest[64];
        for (int k = 0; k < K; k++)
            dest[k] = ms_expert_map_owner(map, map->physical_of[idx[t * K + k]]);
        if (fused) dest[K] = sdst[t];
        for (int k = 0; k < KP; k++) {
            int d = dest[k], dup = 0;
            for (int q = 0; q < k; q++) dup |= dest[q] == d;
            if (dup) continue;
            int64_t r = fill[d]++;
            ws->rec_row[r] = (int32_t)t;
            uint8_t *rec = ws->sbuf + (size_t)r * R;
            int32_t ne = 0;
            for (int q = 0; q < K; q++) {
                int32_t p = -1;
                float wq = 0;
                if (dest[q] == d) {
                    p = map->physical_of[idx[t * K + q]];
                    wq = w[t * K + q];
                    ne++;
                }
                memcpy(rec + 8 + (size_t)q * 8, &p, 4);
                memcpy(rec + 12 + (size_t)q * 8, &wq, 4);
            }
            if (fused) {
                int32_t p = dest[K] == d ? SHARED_ID : -1;
                float wq = dest[K] == d ? 1.0f : 0.0f;
                ne += dest[K] == d;
                memcpy(rec + 8 + (size_t)K * 8, &p, 4);
                memcpy(rec + 12 + (size_t)K * 8, &wq, 4);
            }
            int32_t t32 = (int32_t)t;
            memcpy(rec, &t32, 4);
            memcpy(rec + 4, &ne, 4);
            uint8_t *pl = rec + 8 + (size_t)KP * 8;
            if (bf16) {
                for (int64_t i = 0; i < D; i++) {
                    uint16_t h = ms_f32_to_bf16(x[t * D + i]);
                    memcpy(pl + 2 * i, &h, 2);
                }
            } else {
                memcpy(pl, x + t * D, sizeof(float) * (size_t)D);
            }
        }
    }
    /* who sends what to whom */
    if ((rc = ms_comm_allgather(g, cnt, sizeof(int64_t) * (size_t)N, ws->cnt_all, err))) return rc;
    int64_t n_recv = 0;
    for (int s = 0; s < N; s++) {
        rdisp[s] = (size_t)n_recv * R;
        rbytes[s] = (size_t)ws->cnt_all[(int64_t)s * N + me] * R;
        n_recv += ws->cnt_all[(int64_t)s * N + me];
    }
    int64_t nr1 = MS_MAX(n_recv, 1);
    if (ms_grow_array((void **)&ws->rbuf, &ws->cap_rbuf, n_recv * (int64_t)R + 8, 1) ||
        ms_grow_scratch_f32(xr, cap_xr, nr1 * D) ||
        ms_grow_array((void **)ir, cap_ir, nr1 * K, sizeof(int32_t)) ||
        ms_grow_array((void **)wr, cap_wr, nr1 * K, sizeof(float)) ||
        (fused && ms_grow_array((void **)&ws->rshared, &ws->cap_rshared, nr1, sizeof(float))))
        return ms_err(err, MS_ENOMEM, "out of memory in dispatch");
    if ((rc = ms_comm_alltoallv(g, MS_COMM_A2A_DISPATCH, ws->sbuf, sbytes, sdisp, ws->rbuf, rbytes,
                                rdisp, err)))
        return rc;
    /* unpack: physical ids back to the logical expert each local slot holds */
    for (int64_t r = 0; r < n_recv; r++) {
        const uint8_t *rec = ws->rbuf + (size_t)r * R;
        for (int q = 0; q < K; q++) {
            int32_t p;
            memcpy(&p, rec + 8 + (size_t)q * 8, 4);
            memcpy(&(*wr)[r * K + q], rec + 12 + (size_t)q * 8, 4);
            if (p >= 0 && (p >= map->n_physical || ms_expert_map_owner(map, p) != me))
                return ms_err(err, MS_EINTERNAL,
                              "physical expert %d dispatched to EP rank %d, which does not hold it",
                              p, me);
            (*ir)[r * K + q] = p >= 0 ? map->logical_of[p] : -1;
        }
        if (fused) {
            int32_t p;
            memcpy(&p, rec + 8 + (size_t)K * 8, 4);
            memcpy(&ws->rshared[r], rec + 12 + (size_t)K * 8, 4);
            if (p != SHARED_ID) ws->rshared[r] = 0;
        }
        const uint8_t *pl = rec + 8 + (size_t)KP * 8;
        float *xo = *xr + r * D;
        if (bf16) {
            for (int64_t i = 0; i < D; i++) {
                uint16_t h;
                memcpy(&h, pl + 2 * i, 2);
                xo[i] = ms_bf16_to_f32(h);
            }
        } else {
            memcpy(xo, pl, sizeof(float) * (size_t)D);
        }
    }
    ws->n_send = n_send;
    ws->n_recv = n_recv;
    *n_recv_out = n_recv;
    return 0;
}

int ms_ep_combine(ms_group *g, int64_t D, const float *yr, float *y, ms_ep_ws *ws, ms_errbuf *err)
{
    int N = g->size, rc;
    size_t *sbytes = ws->counts, *sdisp = sbytes + N, *rbytes = sdisp + N, *rdisp = rbytes + N;
    /* the dispatch's row counts turned around: what came from s goes back to s */
    int64_t off_s = 0, off_r = 0;
    for (int s = 0; s < N; s++) {
        int64_t rows_from_s = ws->cnt_all[(int64_t)s * N + g->rank];
        int64_t rows_to_s = ws->cnt_all[(int64_t)g->rank * N + s];
        rbytes[s] = (size_t)(rows_from_s * D) * 4; /* what I send back to s */
        rdisp[s] = (size_t)(off_r * D) * 4;
        sbytes[s] = (size_t)(rows_to_s * D) * 4; /* what s sends back to me */
        sdisp[s] = (size_t)(off_s * D) * 4;
        off_r += rows_from_s;
        off_s += rows_to_s;
    }
    if (ms_grow_scratch_f32(&ws->cbuf, &ws->cap_cbuf, MS_MAX(ws->n_send, 1) * D))
        return ms_err(err, MS_ENOMEM, "out of memory in combine");
    if ((rc = ms_comm_alltoallv(g, MS_COMM_A2A_COMBINE, yr, rbytes, rdisp, ws->cbuf, sbytes, sdisp,
                                err)))
        return rc;
    for (int64_t r = 0; r < ws->n_send; r++)
        ms_axpy_f32(y + (int64_t)ws->rec_row[r] * D, 1.0f, ws->cbuf + r * D, D);
    return 0;
}
