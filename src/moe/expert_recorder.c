/* expert_recorder.c — the expert distribution recorder (expert_recorder.h): pass
 * counts, their all-rank sum, the sliding window, balancedness statistics, the JSON
 * dump. */
#include "moe/expert_recorder.h"

#include "base/log.h"
#include "parallel/eplb.h"

#include <jansson.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define BAL_HIST 1000 /* passes of balancedness kept for the moving averages */

struct ms_expert_recorder {
    int mode, L, E, R, n_ranks, window;
    const ms_expert_map *maps;
    float *pass;        /* [L][R] this pass's hits on this rank (then: all ranks) */
    int pass_any;
    pthread_mutex_t mu; /* guards everything below */
    int64_t *ring;      /* [window][L][R] */
    int64_t *ring_id;   /* [window] forward pass id of each kept pass */
    int head, count;
    int recording;
    int pinned;         /* EPLB runs: recording always (stop does not stop it) */
    int64_t passes;     /* passes with routed tokens */
    double *layer_bal;  /* [L] last pass */
    double bal_hist[BAL_HIST];
    double bal_sum;
    double *load;       /* [n_ranks] scratch */
};

static ms_expert_recorder *g_active;

int ms_recorder_mode_parse(const char *v, int *mode, ms_errbuf *err)
{
    if (!strcmp(v, "stat")) *mode = MS_REC_STAT;
    else if (!strcmp(v, "per_pass")) *mode = MS_REC_PER_PASS;
    else if (!strcmp(v, "per_token"))
        return ms_err(err, MS_EUNSUPPORTED,
                      "--expert-distribution-recorder-mode per_token: not implemented (per-token "
                      "top-k dumps are not built; use stat or per_pass)");
    else
        return ms_err(err, MS_EINVAL,
                      "--expert-distribution-recorder-mode '%s': expected stat, per_pass or "
                      "per_token", v);
    return 0;
}

ms_expert_recorder *ms_expert_recorder_new(int mode, int L, int E, int R, int n_ranks, int window,
                                           const ms_expert_map *maps)
{
    if (L < 1 || R < 1 || n_ranks < 1 || R % n_ranks || window < 1) return NULL;
    ms_expert_recorder *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    *r = (ms_expert_recorder){.mode = mode, .L = L, .E = E, .R = R, .n_ranks = n_ranks,
                              .window = window, .maps = maps};
    pthread_mutex_init(&r->mu, NULL);
    r->pass = calloc((size_t)L * R, sizeof(float));
    r->ring = calloc((size_t)window * L * R, sizeof(int64_t));
    r->ring_id = calloc((size_t)window, sizeof(int64_t));
    r->layer_bal = malloc(sizeof(double) * (size_t)L);
    r->load = malloc(sizeof(double) * (size_t)n_ranks);
    if (!r->pass || !r->ring || !r->ring_id || !r->layer_bal || !r->load) {
        ms_expert_recorder_free(r);
        return NULL;
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
    free(r);
}

void ms_expert_recorder_set_active(ms_expert_recorder *r) { g_active = r; }
ms_expert_recorder *ms_expert_recorder_active(void) { return g_active; }
int ms_expert_recorder_n_layers(const ms_expert_recorder *r) { return r->L; }

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
}

int ms_expert_recorder_end_pass(ms_expert_recorder *r, ms_group *world, ms_errbuf *err)
{
    size_t n = (size_t)r->L * r->R;
    if (world) {
        int rc = ms_comm_allreduce_f32(world, r->pass, n, err);
        if (rc) return rc;
    }
    int per = r->R / r->n_ranks, n_moe = 0;
    double bal = 0.0;
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
    }
    if (n_moe) {
        bal /= n_moe;
        r->bal_hist[r->passes % BAL_HIST] = bal;
        r->bal_sum += bal;
        if (r->recording) {
            int64_t *slot = r->ring + (size_t)r->head * n;
            for (size_t i = 0; i < n; i++) slot[i] = (int64_t)r->pass[i];
            r->ring_id[r->head] = r->passes;
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
               "last_1000_average_balancedness=%.3f", (long long)id, st.last, st.avg10,
               st.avg100, st.avg1000);
    }
    memset(r->pass, 0, sizeof(float) * n);
    r->pass_any = 0;
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

void ms_expert_recorder_lock(ms_expert_recorder *r) { pthread_mutex_lock(&r->mu); }
void ms_expert_recorder_unlock(ms_expert_recorder *r) { pthread_mutex_unlock(&r->mu); }

void ms_expert_recorder_record_always(ms_expert_recorder *r)
{
    pthread_mutex_lock(&r->mu);
    r->recording = 1;
    r->pinned = 1;
    pthread_mutex_unlock(&r->mu);
}

json_t *ms_expert_recorder_dump(ms_expert_recorder *r)
{
    int L = r->L, E = r->E, R = r->R;
    int64_t *lc = calloc((size_t)L * E, sizeof(int64_t)), *tmp = malloc(sizeof(int64_t) * (size_t)R);
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
        if (r->mode == MS_REC_PER_PASS) {
            json_t *pc = json_array();
            for (int l = 0; l < L; l++) json_array_append_new(pc, int64_row(slot + (size_t)l * R, R));
            json_array_append_new(recs, json_pack("{s:I,s:o}", "forward_pass_id",
                                                  (json_int_t)r->ring_id[(first + k) % r->window],
                                                  "physical_count", pc));
        }
    }
    int count = r->count;
    int64_t passes = r->passes;
    r->head = r->count = 0; /* a dump resets */
    for (int l = 0; l < L; l++) { /* the placement as the counts were mapped (under mu) */
        const ms_expert_map *m = r->maps ? &r->maps[l] : NULL;
        for (int p = 0; p < R; p++) tmp[p] = m ? m->logical_of[p] : p;
        json_array_append_new(p2l, int64_row(tmp, R));
        json_array_append_new(lcj, int64_row(lc + (size_t)l * E, E));
    }
    pthread_mutex_unlock(&r->mu);
    free(lc);
    free(tmp);
    json_object_set_new(o, "mode", json_string(r->mode == MS_REC_PER_PASS ? "per_pass" : "stat"));
    json_object_set_new(o, "num_passes", json_integer(count));
    json_object_set_new(o, "forward_pass_id", json_integer((json_int_t)passes));
    json_object_set_new(o, "logical_count", lcj);
    json_object_set_new(o, "physical_to_logical_map", p2l);
    if (r->mode == MS_REC_PER_PASS) json_object_set_new(o, "records", recs);
    else json_decref(recs);
    return o;
}

void ms_expert_recorder_stats(ms_expert_recorder *r, ms_recorder_stats *st)
{
    pthread_mutex_lock(&r->mu);
    memset(st, 0, sizeof *st);
    st->passes = r->passes;
    st->sum = r->bal_sum;
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
    pthread_mutex_unlock(&r->mu);
}

double ms_expert_recorder_layer_balancedness(ms_expert_recorder *r, int layer)
{
    pthread_mutex_lock(&r->mu);
    double b = layer >= 0 && layer < r->L ? r->layer_bal[layer] : 1.0;
    pthread_mutex_unlock(&r->mu);
    return b;
}
