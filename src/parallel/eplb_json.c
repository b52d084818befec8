/* eplb_json.c — the balancer's JSON edges (eplb.h): reading per-layer logical loads
 * (a plain [L][E] array, [steps][L][E], or a recorded distribution's "logical_count")
 * and writing a plan as {"phy2log", "logcnt", "log2phy"}. */
#include "parallel/eplb.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

static int ends_with(const char *s, const char *suf)
{
    size_t n = strlen(s), m = strlen(suf);
    return n >= m && !strcmp(s + n - m, suf);
}

/* Adds the [L][E] matrix m into w (sized by the first matrix seen). */
static int add_matrix(const char *path, json_t *m, float **w, int *L, int *E, ms_errbuf *err)
{
    if (!json_is_array(m) || !json_array_size(m))
        return ms_err(err, MS_EINVAL, "%s: expected a non-empty array of layers", path);
    int nl = (int)json_array_size(m);
    json_t *r0 = json_array_get(m, 0);
    int ne = json_is_array(r0) ? (int)json_array_size(r0) : 0;
    if (ne < 1) return ms_err(err, MS_EINVAL, "%s: layer 0 is not a non-empty array", path);
    if (!*w) {
        *w = calloc((size_t)nl * (size_t)ne, sizeof(float));
        if (!*w) return ms_err(err, MS_ENOMEM, "out of memory");
        *L = nl, *E = ne;
    } else if (nl != *L || ne != *E)
        return ms_err(err, MS_EINVAL, "%s: a step has %d x %d counts, the first %d x %d", path, nl,
                      ne, *L, *E);
    for (int l = 0; l < nl; l++) {
        json_t *r = json_array_get(m, (size_t)l);
        if (!json_is_array(r) || (int)json_array_size(r) != ne)
            return ms_err(err, MS_EINVAL, "%s: layer %d does not have %d experts", path, l, ne);
        for (int e = 0; e < ne; e++) {
            json_t *v = json_array_get(r, (size_t)e);
            if (!json_is_number(v) || json_number_value(v) < 0)
                return ms_err(err, MS_EINVAL,
                              "%s: layer %d expert %d: a load must be a non-negative number", path,
                              l, e);
            (*w)[(size_t)l * ne + e] += (float)json_number_value(v);
        }
    }
    return 0;
}

int ms_eplb_load_counts(const char *path, float **w, int *L, int *E, ms_errbuf *err)
{
    *w = NULL, *L = *E = 0;
    if (ends_with(path, ".pt"))
        return ms_err(err, MS_EINVAL,
                      "%s: a .pt (torch pickle) file cannot be read here; dump the distribution "
                      "as JSON (moeserve's /dump_expert_distribution_record writes JSON with "
                      "SGLang's field names)",
                      path);
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root) return ms_err(err, MS_EINVAL, "%s: %s (line %d)", path, je.text, je.line);
    json_t *m = root;
    int rc = 0;
    if (json_is_object(root)) {
        m = json_object_get(root, "logical_count");
        if (!m) {
            rc = ms_err(err, MS_EINVAL,
                        "%s: an object needs \"logical_count\" ([L][E] or "
                        "[steps][L][E])",
                        path);
            goto out;
        }
    }
    json_t *first = json_array_get(m, 0);
    if (json_is_array(first) && json_is_array(json_array_get(first, 0))) {
        for (size_t s = 0; s < json_array_size(m) && !rc; s++)
            rc = add_matrix(path, json_array_get(m, s), w, L, E, err);
    } else
        rc = add_matrix(path, m, w, L, E, err);
out:
    json_decref(root);
    if (rc) {
        free(*w);
        *w = NULL;
        *L = *E = 0;
    }
    return rc;
}

static json_t *int_row(const int32_t *v, int n)
{
    json_t *a = json_array();
    for (int i = 0; a && i < n; i++)
        if (json_array_append_new(a, json_integer(v[i]))) {
            json_decref(a);
            return NULL;
        }
    return a;
}

json_t *ms_eplb_plan_json(const ms_eplb_plan *p)
{
    int L = p->n_layers, E = p->n_logical, R = p->n_physical, C = p->maxcnt;
    json_t *o = json_object(), *phy = json_array(), *cnt = json_array(), *l2p = json_array();
    int bad = !o || !phy || !cnt || !l2p;
    for (int l = 0; l < L && !bad; l++) {
        json_t *layer = json_array();
        bad |= json_array_append_new(phy, int_row(p->phy2log + (size_t)l * R, R));
        bad |= json_array_append_new(cnt, int_row(p->logcnt + (size_t)l * E, E));
        for (int e = 0; e < E && layer; e++)
            bad |= json_array_append_new(layer, int_row(p->log2phy + ((size_t)l * E + e) * C, C));
        bad |= json_array_append_new(l2p, layer);
    }
    if (!bad) {
        bad |= json_object_set_new(o, "phy2log", phy);
        phy = NULL;
        bad |= json_object_set_new(o, "logcnt", cnt);
        cnt = NULL;
        bad |= json_object_set_new(o, "log2phy", l2p);
        l2p = NULL;
    }
    json_decref(phy);
    json_decref(cnt);
    json_decref(l2p);
    if (bad) {
        json_decref(o);
        return NULL;
    }
    return o;
}
