/* expert_recorder.c — the expert distribution recorder (expert_recorder.h): pass
 * counts, their all-rank sum, the sliding window, balancedness statistics, per_token's
 * token rows (gathered to world rank 0 into a ring of max_tokens rows), the JSON
 * dump. */
#include "moe/expert_recorder.h"

#include "base/log.h"
#include "base/util.h"
#include "parallel/eplb.h"

#include <jansson.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define BAL_HIST 1000 /* passes of balancedness kept for the moving averages */
#define META     3    /* a token row's head: input id, position, flags (FIRST | kind << 1) */
#define FIRST    1    /* the row opens its sequence */

struct ms_expert_recorder {
    int mode, L, E, R, K, n_ranks, window;
    const ms_expert_map *maps;
    float *pass; /* [L][R] this pass's hits on this rank (then: all ranks); per_token:
                  * + 1, the recording flag summed over the ranks */
    int pass_any;
    /* per_token, main thread: this pass's rows on this rank, and the gather's scratch */
    int32_t **prow; /* [L] → [prow_n[l]][K] physical ids of the rows this rank routed */
    int64_t *prow_n, *prow_cap;
    int32_t *pmeta; /* [pmeta_n][META] the tokens this rank's DP group runs (leaders) */
    int64_t pmeta_n, pmeta_cap;
    int32_t *send; /* [rows][L][K] packed */
    int64_t send_cap;
    int32_t *gtopk, *gmeta; /* world rank 0: every rank's, in rank order */
    int64_t gtopk_cap, gmeta_cap, g_nt, g_nm;
    size_t *gsz;   /* [4][world size]: bytes and displacements of the two gathers */
    int64_t *gcnt; /* [2][world size] rows each rank sends */
    int g_w;
    pthread_mutex_t mu; /* guards everything below */
    int64_t *ring;      /* [window][L][R] */
    int64_t *ring_id;   /* [window] forward pass id of each kept pass */
    int head, count;
    int recording;
    int pinned;        /* EPLB runs: recording always (stop does not stop it) */
    int64_t passes;    /* passes with routed tokens */
    double *layer_bal; /* [L] last pass */
    double bal_hist[BAL_HIST];
    double bal_sum;
    int pass_kinds;             /* 1 << MS_REC_SEQ_* of this pass's rows (this rank's batch) */
    double fm_sum[MS_REC_N_FM]; /* Σ per-pass balancedness by the pass's forward mode */
    int64_t fm_count[MS_REC_N_FM];
    double touched_max, touched_mean; /* the last pass (ms_recorder_stats) */
    double *load;                     /* [n_ranks] scratch */
    /* per_token: the token rows of the kept passes, world rank 0 */
    int32_t *tok;                 /* [max_tokens][META + L·K], row a at a mod max_tokens */
    int64_t max_tokens, tok_next; /* rows ever stored (the next row's absolute index) */
    int64_t *ring_tok; /* [window][3]: first row (absolute), rows stored, rows the pass had */
};

static ms_expert_recorder *g_active;

int ms_recorder_mode_parse(const char *v, int *mode, ms_errbuf *err)
{
    if (!strcmp(v, "stat"))
        *mode = MS_REC_STAT;
    else if (!strcmp(v, "per_pass"))
        *mode = MS_REC_PER_PASS;
    else if (!strcmp(v, "per_token"))
        *mode = MS_REC_PER_TOKEN;
    else
        return ms_err(err, MS_EINVAL,
                      "--expert-distribution-recorder-mode '%s': expected stat, per_pass or "
                      "per_token",
                      v);
    return 0;
}

ms_expert_recorder *ms_expert_recorder_new(int mode, int L, int E, int R, int n_ranks, int window,
                                           int K, int64_t max_tokens, const ms_expert_map *maps)
{
    if (L < 1 || R < 1 || n_ranks < 1 || R % n_ranks || window < 1 || K < 1 || K > R) return NULL;
    int tok = mode == MS_REC_PER_TOKEN;
    if (tok && (max_tokens < 1 || max_tokens > ((int64_t)1 << 40) / ((int64_t)L * K + META)))
        return NULL;
    ms_expert_recorder *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    *r = (ms_expert_recorder){.mode = mode,
                              .L = L,
                              .E = E,
                              .R = R,
                              .K = K,
                              .n_ranks = n_ranks,
                              .window = window,
                              .maps = maps,
                              .max_tokens = tok ? max_tokens : 0};
    pthread_mutex_init(&r->mu, NULL);
    r->pass = calloc((size_t)L * R + 1, sizeof(float));
    r->ring = calloc((size_t)window * L * R, sizeof(int64_t));
    r->ring_id = calloc((size_t)window, sizeof(int64_t));
    r->layer_bal = malloc(sizeof(double) * (size_t)L);
    r->load = malloc(sizeof(double) * (size_t)n_ranks);
    if (!r->pass || !r->ring || !r->ring_id || !r->layer_bal || !r->load) {
        ms_expert_recorder_free(r);
        return NULL;
    }
    if (tok) {
        r->prow = calloc((size_t)L, sizeof *r->prow);
        r->prow_n = calloc((size_t)L, sizeof(int64_t));
        r->prow_cap = calloc((size_t)L, sizeof(int64_t));
        r->ring_tok = calloc((size_t)window * 3, sizeof(int64_t));
        r->tok = malloc(sizeof(int32_t) * (size_t)max_tokens * (size_t)(META + (int64_t)L * K));
        if (!r->prow || !r->prow_n || !r->prow_cap || !r->ring_tok || !r->tok) {
            ms_expert_recorder_free(r);
            return NULL;
        }
    }
    for (int l = 0; l < L; l++) r->layer_bal[l] = 1.0;
    return r;
}

void ms_expert_recorder_free(ms_expert_recorder *r)
{
    if (!r) return;
    if (g_active == r) g_active = NULL;
    pthread_mutex_destroy(&r->mu);
    free(r->pass);
    free(r->ring);
    free(r->ring_id);
    free(r->layer_bal);
    free(r->load);
    for (int l = 0; r->prow && l < r->L; l++) free(r->prow[l]);
    free(r->prow);
    free(r->prow_n);
    free(r->prow_cap);
    free(r->pmeta);
    free(r->send);
    free(r->gtopk);
    free(r->gmeta);
    free(r->gsz);
    free(r->gcnt);
    free(r->tok);
    free(r->ring_tok);
    free(r);
}

void ms_expert_recorder_set_active(ms_expert_recorder *r)
{
    g_active = r;
}
ms_expert_recorder *ms_expert_recorder_active(void)
{
    return g_active;
}
int ms_expert_recorder_n_layers(const ms_expert_recorder *r)
{
    return r->L;
}

void ms_expert_recorder_add(ms_expert_recorder *r, int layer, const ms_expert_map *map,
                            const int32_t *idx, int64_t n, int K)
{
    if (layer < 0 || layer >= r->L || n <= 0) return;
    float *row = r->pass + (size_t)layer * r->R;
    for (int64_t i = 0; i < n * K; i++) {
        int e = idx[i];
        if (e < 0) continue;
        int p = map ? map->physical_of[e] : e;
        if (p >= 0 && p < r->R) row[p] += 1.0f;
    }
    r->pass_any = 1;
    if (r->mode != MS_REC_PER_TOKEN) return;
    void *a = r->prow[layer];
    int64_t have = r->prow_n[layer], cap = r->prow_cap[layer];
    if (ms_grow_array(&a, &cap, (have + n) * r->K, sizeof(int32_t))) return; /* rows lost */
    r->prow[layer] = a, r->prow_cap[layer] = cap;
    int32_t *out = r->prow[layer] + have * r->K;
    for (int64_t t = 0; t < n; t++)
        for (int k = 0; k < r->K; k++) {
            int e = k < K ? idx[t * K + k] : -1;
            int p = e < 0 ? -1 : map ? map->physical_of[e] : e;
            out[t * r->K + k] = p >= 0 && p < r->R ? p : -1;
        }
    r->prow_n[layer] = have + n;
}

/* SGLang's ForwardMode of a pass from the kinds of its rows (1 << MS_REC_SEQ_*). */
static int fm_of(int kinds)
{
    return kinds & 1 << MS_REC_SEQ_VERIFY                               ? MS_REC_FM_TARGET_VERIFY
           : kinds == (1 << MS_REC_SEQ_EXTEND | 1 << MS_REC_SEQ_DECODE) ? MS_REC_FM_MIXED
           : kinds & 1 << MS_REC_SEQ_EXTEND                             ? MS_REC_FM_EXTEND
           : kinds & 1 << MS_REC_SEQ_DECODE                             ? MS_REC_FM_DECODE
                                                                        : MS_REC_FM_IDLE;
}
static const char *const fm_upper[MS_REC_N_FM] = {"EXTEND", "DECODE", "MIXED", "TARGET_VERIFY",
                                                  "IDLE"};

const char *ms_recorder_forward_mode_name(int fm)
{
    static const char *const lower[MS_REC_N_FM] = {"extend", "decode", "mixed", "target_verify",
                                                   "idle"};
    return fm >= 0 && fm < MS_REC_N_FM ? lower[fm] : "idle";
}

void ms_expert_recorder_add_seq(ms_expert_recorder *r, const int32_t *ids, int32_t n,
                                int64_t start_pos, int kind)
{
    if (n <= 0) return;
    r->pass_kinds |= 1 << kind;
    if (r->mode != MS_REC_PER_TOKEN) return;
    void *a = r->pmeta;
    if (ms_grow_array(&a, &r->pmeta_cap, (r->pmeta_n + n) * META, sizeof(int32_t))) return;
    r->pmeta = a;
    int32_t *m = r->pmeta + r->pmeta_n * META;
    for (int32_t j = 0; j < n; j++, m += META) {
        m[0] = ids[j];
        m[1] = (int32_t)(start_pos + j);
        m[2] = (j == 0 ? FIRST : 0) | kind << 1;
    }
    r->pmeta_n += n;
}

void ms_expert_recorder_discard_pass(ms_expert_recorder *r)
{
    memset(r->pass, 0, sizeof(float) * ((size_t)r->L * r->R + 1));
    r->pass_any = 0;
    r->pass_kinds = 0;
    if (r->mode != MS_REC_PER_TOKEN) return;
    memset(r->prow_n, 0, sizeof(int64_t) * (size_t)r->L);
    r->pmeta_n = 0;
}

/* per_token: every rank's routed rows and DP-leader tokens to world rank 0 (g_nt topk
 * rows in gtopk, g_nm token rows in gmeta, rank order).  Every rank of world calls it. */
static int gather_tokens(ms_expert_recorder *r, ms_group *world, ms_errbuf *err)
{
    int L = r->L, K = r->K, W = world ? world->size : 1, root = !world || world->rank == 0;
    int64_t rows = 0, lk = (int64_t)L * K;
    for (int l = 0; l < L; l++) rows = MS_MAX(rows, r->prow_n[l]);
    void *a = r->send;
    if (ms_grow_array(&a, &r->send_cap, MS_MAX(rows * lk, 1), sizeof(int32_t)))
        return ms_err(err, MS_ENOMEM, "out of memory for the per_token recorder");
    r->send = a;
    for (int64_t t = 0; t < rows; t++) /* [t][l][k]; a layer without the row: -1 */
        for (int l = 0; l < L; l++) {
            int32_t *o = r->send + (t * L + l) * K;
            if (t < r->prow_n[l])
                memcpy(o, r->prow[l] + t * K, sizeof(int32_t) * (size_t)K);
            else
                for (int k = 0; k < K; k++) o[k] = -1;
        }
    if (W != r->g_w) {
        free(r->gsz), free(r->gcnt);
        r->gsz = malloc(sizeof(size_t) * 4 * (size_t)W);
        r->gcnt = malloc(sizeof(int64_t) * 2 * (size_t)W);
        r->g_w = r->gsz && r->gcnt ? W : 0;
        if (!r->g_w) return ms_err(err, MS_ENOMEM, "out of memory for the per_token recorder");
    }
    int64_t mine[2] = {rows, r->pmeta_n};
    int rc;
    if (!world)
        memcpy(r->gcnt, mine, sizeof mine);
    else if ((rc = ms_comm_gather(world, mine, sizeof mine, r->gcnt, 0, err)))
        return rc;
    int64_t nt = 0, nm = 0;
    if (root) {
        for (int i = 0; i < W; i++) {
            r->gsz[i] = sizeof(int32_t) * (size_t)(r->gcnt[2 * i] * lk);
            r->gsz[W + i] = sizeof(int32_t) * (size_t)nt * (size_t)lk;
            r->gsz[2 * W + i] = sizeof(int32_t) * (size_t)(r->gcnt[2 * i + 1] * META);
            r->gsz[3 * W + i] = sizeof(int32_t) * (size_t)nm * META;
            nt += r->gcnt[2 * i], nm += r->gcnt[2 * i + 1];
        }
        void *b = r->gtopk, *c = r->gmeta;
        int bad = ms_grow_array(&b, &r->gtopk_cap, MS_MAX(nt * lk, 1), sizeof(int32_t));
        r->gtopk = b;
        bad = bad || ms_grow_array(&c, &r->gmeta_cap, MS_MAX(nm * META, 1), sizeof(int32_t));
        r->gmeta = c;
        if (bad) /* the other ranks' gathers end at the collectives' deadline */
            return ms_err(err, MS_ENOMEM, "out of memory for the per_token recorder's %lld rows",
                          (long long)MS_MAX(nt, nm));
    }
    if (!world) {
        memcpy(r->gtopk, r->send, sizeof(int32_t) * (size_t)(nt * lk));
        if (nm) memcpy(r->gmeta, r->pmeta, sizeof(int32_t) * (size_t)(nm * META));
    } else {
        if ((rc = ms_comm_gatherv(world, r->send, sizeof(int32_t) * (size_t)(rows * lk), r->gtopk,
                                  r->gsz, r->gsz + W, 0, err)) ||
            (rc = ms_comm_gatherv(world, r->pmeta, sizeof(int32_t) * (size_t)(r->pmeta_n * META),
                                  r->gmeta, r->gsz + 2 * W, r->gsz + 3 * W, 0, err)))
            return rc;
    }
    r->g_nt = nt, r->g_nm = nm;
    return 0;
}

/* per_token, world rank 0, mu held: the gathered rows of the pass kept in window slot h
 * into the token ring (rows beyond max_tokens of one pass are not kept). */
static void keep_tokens(ms_expert_recorder *r, int h)
{
    int64_t lk = (int64_t)r->L * r->K, w = META + lk, n = MS_MAX(r->g_nt, r->g_nm);
    int64_t keep = MS_MIN(n, r->max_tokens);
    for (int64_t t = 0; t < keep; t++) {
        int32_t *row = r->tok + ((r->tok_next + t) % r->max_tokens) * w;
        if (t < r->g_nm)
            memcpy(row, r->gmeta + t * META, sizeof(int32_t) * META);
        else
            row[0] = row[1] = -1, row[2] = 0;
        if (t < r->g_nt)
            memcpy(row + META, r->gtopk + t * lk, sizeof(int32_t) * (size_t)lk);
        else
            for (int64_t i = 0; i < lk; i++) row[META + i] = -1;
    }
    r->ring_tok[3 * h] = r->tok_next;
    r->ring_tok[3 * h + 1] = keep;
    r->ring_tok[3 * h + 2] = n;
    r->tok_next += keep;
}

int ms_expert_recorder_end_pass(ms_expert_recorder *r, ms_group *world, ms_errbuf *err)
{
    size_t n = (size_t)r->L * r->R;
    int tok = r->mode == MS_REC_PER_TOKEN, rc;
    if (tok) { /* rank 0 knows whether it records: every rank learns it from the sum */
        pthread_mutex_lock(&r->mu);
        r->pass[n] = r->recording ? 1.0f : 0.0f;
        pthread_mutex_unlock(&r->mu);
    }
    if (world && (rc = ms_comm_allreduce_f32(world, r->pass, n + (size_t)tok, err))) return rc;
    int keep_tok = tok && r->pass[n] > 0.5f;
    r->g_nt = r->g_nm = 0;
    if (keep_tok && (rc = gather_tokens(r, world, err))) return rc;
    int root = !world || world->rank == 0;
    int per = r->R / r->n_ranks, n_moe = 0;
    double bal = 0.0, t_max = 0.0, t_all = 0.0;
    pthread_mutex_lock(&r->mu);
    for (int l = 0; l < r->L; l++) {
        const float *row = r->pass + (size_t)l * r->R;
        double tot = 0.0;
        for (int g = 0; g < r->n_ranks; g++) r->load[g] = 0.0;
        for (int p = 0; p < r->R; p++) r->load[p / per] += row[p], tot += row[p];
        if (tot <= 0) continue; /* a dense layer, or nothing routed */
        r->layer_bal[l] = ms_eplb_balancedness(r->load, r->n_ranks);
        bal += r->layer_bal[l];
        n_moe++;
        int most = 0, hit = 0;
        for (int g = 0; g < r->n_ranks; g++) {
            int k = 0;
            for (int s = 0; s < per; s++) k += row[g * per + s] > 0;
            most = k > most ? k : most;
            hit += k;
        }
        t_max += most, t_all += (double)hit / r->n_ranks;
    }
    if (n_moe) {
        bal /= n_moe;
        r->touched_max = t_max / n_moe, r->touched_mean = t_all / n_moe;
        r->bal_hist[r->passes % BAL_HIST] = bal;
        r->bal_sum += bal;
        r->fm_sum[fm_of(r->pass_kinds)] += bal;
        r->fm_count[fm_of(r->pass_kinds)]++;
        if (tok ? keep_tok : r->recording) {
            int64_t *slot = r->ring + (size_t)r->head * n;
            for (size_t i = 0; i < n; i++) slot[i] = (int64_t)r->pass[i];
            r->ring_id[r->head] = r->passes;
            if (tok && root) keep_tokens(r, r->head);
            r->head = (r->head + 1) % r->window;
            if (r->count < r->window) r->count++;
        }
        r->passes++;
    }
    int64_t id = r->passes;
    pthread_mutex_unlock(&r->mu);
    if (n_moe && id % 100 == 0) {
        ms_recorder_stats st;
        ms_expert_recorder_stats(r, &st);
        MS_LOG(MS_INFO, "eplb",
               "[Expert Balancedness] forward_pass_id=%lld current_pass_balancedness=%.3f "
               "last_10_average_balancedness=%.3f last_100_average_balancedness=%.3f "
               "last_1000_average_balancedness=%.3f",
               (long long)id, st.last, st.avg10, st.avg100, st.avg1000);
    }
    ms_expert_recorder_discard_pass(r);
    return 0;
}

void ms_expert_recorder_start(ms_expert_recorder *r)
{
    pthread_mutex_lock(&r->mu);
    r->head = r->count = 0;
    r->recording = 1;
    pthread_mutex_unlock(&r->mu);
}

void ms_expert_recorder_stop(ms_expert_recorder *r)
{
    pthread_mutex_lock(&r->mu);
    r->recording = r->pinned; /* EPLB's window keeps recording */
    pthread_mutex_unlock(&r->mu);
}

static json_t *int64_row(const int64_t *v, int n)
{
    json_t *a = json_array();
    for (int i = 0; a && i < n; i++) json_array_append_new(a, json_integer((json_int_t)v[i]));
    return a;
}

/* Adds the window's pass k (0: oldest) to lc[L][E] through the current maps; mu held. */
static const int64_t *window_pass(ms_expert_recorder *r, int k, int64_t *lc)
{
    size_t n = (size_t)r->L * r->R;
    int first = (r->head - r->count + r->window) % r->window;
    const int64_t *slot = r->ring + (size_t)((first + k) % r->window) * n;
    for (int l = 0; l < r->L; l++) {
        const ms_expert_map *m = r->maps ? &r->maps[l] : NULL;
        for (int p = 0; p < r->R; p++) {
            int e = m ? m->logical_of[p] : p;
            if (e >= 0 && e < r->E) lc[(size_t)l * r->E + e] += slot[(size_t)l * r->R + p];
        }
    }
    return slot;
}

int ms_expert_recorder_take_window(ms_expert_recorder *r, int64_t *lc)
{
    memset(lc, 0, sizeof(int64_t) * (size_t)r->L * (size_t)r->E);
    pthread_mutex_lock(&r->mu);
    int count = r->count;
    for (int k = 0; k < count; k++) window_pass(r, k, lc);
    r->head = r->count = 0;
    pthread_mutex_unlock(&r->mu);
    return count;
}

void ms_expert_recorder_lock(ms_expert_recorder *r)
{
    pthread_mutex_lock(&r->mu);
}
void ms_expert_recorder_unlock(ms_expert_recorder *r)
{
    pthread_mutex_unlock(&r->mu);
}

void ms_expert_recorder_record_always(ms_expert_recorder *r)
{
    pthread_mutex_lock(&r->mu);
    r->recording = 1;
    r->pinned = 1;
    pthread_mutex_unlock(&r->mu);
}

static json_t *int32_row(const int32_t *v, int n)
{
    json_t *a = json_array();
    for (int i = 0; a && i < n; i++) json_array_append_new(a, json_integer(v[i]));
    return a;
}

static const char *const mode_names[] = {
    [MS_REC_STAT] = "stat", [MS_REC_PER_PASS] = "per_pass", [MS_REC_PER_TOKEN] = "per_token"};

/* per_token, mu held: the token fields of the pass in window slot h into rec, or 0 when
 * its rows left the token ring (max_tokens) — the pass is then not dumped. */
static int token_fields(ms_expert_recorder *r, int h, json_t *rec)
{
    int64_t first = r->ring_tok[3 * h], n = r->ring_tok[3 * h + 1], w = META + (int64_t)r->L * r->K;
    if (first < r->tok_next - r->max_tokens) return 0;
    json_t *ids = json_array(), *pos = json_array(), *lens = json_array(), *topk = json_array();
    int kinds = 0;
    int64_t run = 0;
    for (int64_t t = 0; t < n; t++) {
        const int32_t *row = r->tok + ((first + t) % r->max_tokens) * w;
        json_array_append_new(ids, json_integer(row[0]));
        json_array_append_new(pos, json_integer(row[1]));
        if ((row[2] & FIRST) && run) json_array_append_new(lens, json_integer(run)), run = 0;
        run++;
        kinds |= 1 << (row[2] >> 1);
    }
    if (run) json_array_append_new(lens, json_integer(run));
    for (int l = 0; l < r->L; l++) { /* [L][n][K]: row t's layer l */
        json_t *lay = json_array();
        for (int64_t t = 0; t < n; t++)
            json_array_append_new(lay, int32_row(r->tok + ((first + t) % r->max_tokens) * w + META +
                                                     (int64_t)l * r->K,
                                                 r->K));
        json_array_append_new(topk, lay);
    }
    json_object_set_new(rec, "forward_mode", json_string(fm_upper[fm_of(kinds)]));
    json_object_set_new(rec, "input_ids", ids);
    json_object_set_new(rec, "positions", pos);
    json_object_set_new(rec, "extend_seq_lens", lens);
    json_object_set_new(rec, "topk_ids_of_layer", topk);
    json_object_set_new(rec, "num_tokens", json_integer((json_int_t)r->ring_tok[3 * h + 2]));
    return 1;
}

json_t *ms_expert_recorder_dump(ms_expert_recorder *r)
{
    int L = r->L, E = r->E, R = r->R, detail = r->mode != MS_REC_STAT;
    int64_t *lc = calloc((size_t)L * E, sizeof(int64_t)),
            *tmp = malloc(sizeof(int64_t) * (size_t)R);
    json_t *o = json_object(), *p2l = json_array(), *lcj = json_array(), *recs = json_array();
    if (!lc || !tmp || !o || !p2l || !lcj || !recs) {
        free(lc);
        free(tmp);
        json_decref(o), json_decref(p2l), json_decref(lcj), json_decref(recs);
        return NULL;
    }
    pthread_mutex_lock(&r->mu);
    int first = (r->head - r->count + r->window) % r->window;
    for (int k = 0; k < r->count; k++) {
        const int64_t *slot = window_pass(r, k, lc);
        if (!detail) continue;
        int h = (first + k) % r->window;
        json_t *pc = json_array();
        for (int l = 0; l < L; l++) json_array_append_new(pc, int64_row(slot + (size_t)l * R, R));
        json_t *rec = json_pack("{s:I,s:s,s:o}", "forward_pass_id", (json_int_t)r->ring_id[h],
                                "gatherer_key", "primary", "global_physical_count", pc);
        if (r->mode == MS_REC_PER_TOKEN && !token_fields(r, h, rec))
            json_decref(rec);
        else
            json_array_append_new(recs, rec);
    }
    int count = r->count;
    int64_t passes = r->passes;
    r->head = r->count = 0;       /* a dump resets */
    for (int l = 0; l < L; l++) { /* the placement as the counts were mapped (under mu) */
        const ms_expert_map *m = r->maps ? &r->maps[l] : NULL;
        for (int p = 0; p < R; p++) tmp[p] = m ? m->logical_of[p] : p;
        json_array_append_new(p2l, int64_row(tmp, R));
        json_array_append_new(lcj, int64_row(lc + (size_t)l * E, E));
    }
    pthread_mutex_unlock(&r->mu);
    free(lc);
    free(tmp);
    json_object_set_new(o, "mode", json_string(mode_names[r->mode]));
    json_object_set_new(o, "num_passes", json_integer(count));
    json_object_set_new(o, "forward_pass_id", json_integer((json_int_t)passes));
    json_object_set_new(o, "logical_count", lcj);
    if (detail) json_object_set_new(o, "last_physical_to_logical_map", json_deep_copy(p2l));
    json_object_set_new(o, "physical_to_logical_map", p2l);
    if (!detail) {
        json_decref(recs);
        return o;
    }
    json_object_set_new(o, "records", recs);
    if (r->mode == MS_REC_PER_TOKEN) {
        json_object_set_new(o, "max_tokens", json_integer((json_int_t)r->max_tokens));
        json_object_set_new(
            o, "note",
            json_string(
                "SGLang's per_token dump as JSON (C writes no torch .pt): one record per forward "
                "pass with every rank's tokens in world rank order (SGLang: one file per rank); "
                "topk_ids_of_layer[layer][token] holds the physical experts of num_experts_per_tok "
                "(SGLang pads to 8 with -1); at most max_tokens token rows are kept, the oldest "
                "passes' first; logical_count sums the whole window"));
    }
    return o;
}

void ms_expert_recorder_stats(ms_expert_recorder *r, ms_recorder_stats *st)
{
    pthread_mutex_lock(&r->mu);
    memset(st, 0, sizeof *st);
    st->passes = r->passes;
    st->sum = r->bal_sum;
    for (int f = 0; f < MS_REC_N_FM; f++)
        st->fm_sum[f] = r->fm_sum[f], st->fm_count[f] = r->fm_count[f];
    st->recording = r->recording;
    double *avg[3] = {&st->avg10, &st->avg100, &st->avg1000};
    int win[3] = {10, 100, 1000};
    for (int w = 0; w < 3; w++) {
        int64_t k = r->passes < win[w] ? r->passes : win[w];
        double s = 0;
        for (int64_t i = 1; i <= k; i++) s += r->bal_hist[(r->passes - i) % BAL_HIST];
        *avg[w] = k ? s / (double)k : 1.0;
    }
    st->last = r->passes ? r->bal_hist[(r->passes - 1) % BAL_HIST] : 1.0;
    st->touched_max = r->touched_max, st->touched_mean = r->touched_mean;
    pthread_mutex_unlock(&r->mu);
}

double ms_expert_recorder_layer_balancedness(ms_expert_recorder *r, int layer)
{
    pthread_mutex_lock(&r->mu);
    double b = layer >= 0 && layer < r->L ? r->layer_bal[layer] : 1.0;
    pthread_mutex_unlock(&r->mu);
    return b;
}
