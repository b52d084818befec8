/* family.c — the family registry and the one config.json reader
 * (family.h): decodes the JSON once, asks each family in turn whether it is
 * its own, and lets that family parse the shape; plus what every model
 * answers the same way whatever its family (shape, threads, the whole
 * forward as embed + run_layers + head, prepacking through each_view).
 * Tables: any thread; models: the rank's main thread.
 */
#include "model/family.h"

#include "base/util.h"
#include "kernels/kernels.h"
#include "model/deepseek_v4.h"
#include "model/model.h"
#include "model/planner_families.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

static const ms_family *const families[] = {
    &ms_family_deepseek_v4, /* before V3: a V4 config also carries MLA-like fields */
    &ms_family_deepseek_v3,
    &ms_family_qwen3_moe,
    &ms_family_llama, /* Llama-style GQA: the fallback for any other decoder */
    NULL,
};

const ms_family *const *ms_families(void)
{
    return families;
}

const ms_family *ms_family_by_name(const char *name)
{
    for (int i = 0; families[i]; i++)
        if (!strcmp(families[i]->name, name)) return families[i];
    return NULL;
}

bool ms_shape_layer_is_moe(const ms_model_shape *s, int layer)
{
    int freq = s->moe_layer_freq > 0 ? s->moe_layer_freq : 1;
    return s->n_routed > 0 && layer >= s->first_k_dense && layer % freq == 0;
}

int ms_shape_n_moe_layers(const ms_model_shape *s)
{
    int n = 0;
    for (int l = 0; l < s->n_layers; l++) n += ms_shape_layer_is_moe(s, l);
    return n;
}

void ms_shape_layout_model(const ms_model_shape *s, ms_layout_model *out)
{
    memset(out, 0, sizeof *out);
    out->n_heads = s->n_heads;
    out->n_kv_heads = s->attn == MS_ATTN_GQA ? s->n_kv_heads : 0;
    out->n_routed_experts = s->n_routed;
    out->n_layers = s->n_layers;
    out->n_dense_layers = s->n_layers - ms_shape_n_moe_layers(s);
}

int ms_family_parse(const char *text, const ms_family **fam, ms_model_shape *out, ms_errbuf *err)
{
    memset(out, 0, sizeof *out);
    if (fam) *fam = NULL;
    json_error_t je;
    json_t *root = json_loads(text, JSON_REJECT_DUPLICATES, &je);
    if (!root || !json_is_object(root)) {
        if (root) json_decref(root);
        return ms_err(err, MS_EFORMAT, "config.json: %s (line %d)",
                      root ? "not an object" : je.text, je.line);
    }
    const ms_family *f = NULL;
    for (int i = 0; families[i] && !f; i++)
        if (families[i]->match(root)) f = families[i];
    int rc;
    if (!f) {
        rc = ms_err(err, MS_EUNSUPPORTED, "config.json: no model family matches it");
    } else {
        out->bos_token_id = out->eos_token_id = -1;
        out->fp8_scale_bytes = 4;
        out->published = MS_WEIGHTS_BF16;
        rc = f->parse(root, out, err);
        out->family = f;
        if (!rc && fam) *fam = f;
    }
    json_decref(root);
    return rc;
}

int ms_family_load(const char *path, int is_dir, const ms_family **fam, ms_model_shape *out,
                   ms_errbuf *err)
{
    char file[1200];
    if (is_dir && !ms_path_join(file, sizeof file, path, "config.json"))
        return ms_err(err, MS_EINVAL, "model path too long: %s", path);
    const char *p = is_dir ? file : path;
    char *text = NULL;
    int rc = ms_read_file(p, MS_CONFIG_MAX_BYTES, &text, NULL);
    if (rc) return ms_err(err, rc, "%s: cannot read: %s", p, ms_strerror(rc));
    rc = ms_family_parse(text, fam, out, err);
    free(text);
    return rc;
}

int ms_family_kv_spec(const ms_model_shape *s, const ms_kv_spec_opts *o, ms_kv_spec *out,
                      ms_errbuf *err)
{
    if (!s->family) return ms_err(err, MS_EINVAL, "model shape without a family");
    return s->family->kv_spec(s, o, out, err);
}

int ms_model_open(ms_model **out, const char *dir, const ms_model_opts *opts, ms_errbuf *err)
{
    *out = NULL;
    const ms_family *f;
    ms_model_shape shape;
    int rc = ms_family_load(dir, 1, &f, &shape, err);
    if (rc) return rc;
    if (!f->open)
        return ms_err(err, MS_EUNSUPPORTED,
                      "%s: the %s family (%s) is known to `moeserve plan` only; this engine "
                      "cannot load its weights yet",
                      dir, f->name, f->models);
    if ((rc = f->open(out, dir, opts, err))) return rc;
    (*out)->family = f;
    (*out)->shape = shape;
    return 0;
}

void ms_model_free(ms_model *m)
{
    if (!m) return;
    ms_free_aligned(m->panels);
    if (m->family) m->family->free(m);
}

const ms_family *ms_model_family(const ms_model *m)
{
    return m->family;
}
const ms_model_shape *ms_model_shape_of(const ms_model *m)
{
    return &m->shape;
}
int ms_model_head_split(const ms_model *m)
{
    return m->family->head_split;
}
ms_pool *ms_model_threads(const ms_model *m)
{
    return m->pool;
}
int64_t ms_model_active_bytes_per_token(const ms_model *m)
{
    return m->active_bytes_per_token;
}
int64_t ms_model_n_params(const ms_model *m)
{
    return m->n_params;
}
int ms_model_n_mtp_layers(const ms_model *m)
{
    return m->n_mtp_layers;
}
int ms_model_has_draft(const ms_model *m)
{
    return m->family->draft && (m->mtp != NULL || (m->v4 != NULL && m->n_mtp_layers > 0));
}

int ms_model_max_spec_steps(const ms_model *m)
{
    return m->v4 ? V4_STATE_SPILL : 0;
}

int64_t ms_model_draft_hidden_width(const ms_model *m)
{
    return m->v4 ? m->shape.hidden * m->shape.hc_mult : m->shape.hidden;
}

int32_t ms_draft_out_rows(const ms_batch_seq *sq)
{
    if (sq->n_tokens <= 0) return 0;
    int32_t n = 1;
    if (sq->logits) n = MS_MAX(n, sq->n_logits);
    if (sq->hidden) n = MS_MAX(n, sq->n_hidden > 0 ? sq->n_hidden : sq->logits ? sq->n_logits : 1);
    return MS_MIN(n, sq->n_tokens);
}

void ms_batch_seq_keep_last(ms_batch_seq *b, int32_t keep, int64_t hidden_width)
{
    int32_t drop = b->n_tokens > keep ? b->n_tokens - keep : 0;
    if (drop == 0) return;
    b->tokens += drop;
    b->start_pos += drop;
    b->n_tokens = keep;
    if (b->hidden_in) b->hidden_in += (int64_t)drop * hidden_width;
}

int ms_model_set_draft_vocab(ms_model *m, const int32_t *ids, int64_t n, ms_errbuf *err)
{
    const ms_mat *H = &m->lm_head;
    int64_t D = H->cols;
    if (n <= 0 || n > H->rows)
        return ms_err(err, MS_EINVAL, "draft vocabulary of %lld ids (the model has %lld)",
                      (long long)n, (long long)H->rows);
    uint16_t *w = ms_alloc_aligned((size_t)(n * D), sizeof(uint16_t));
    int32_t *v = malloc(sizeof(int32_t) * (size_t)n);
    if (!w || !v) {
        ms_free_aligned(w);
        free(v);
        return ms_err(err, MS_ENOMEM, "out of memory (draft head)");
    }
    for (int64_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= H->rows) {
            ms_free_aligned(w);
            free(v);
            return ms_err(err, MS_ERANGE, "draft vocabulary: token id %d outside [0, %lld)", ids[i],
                          (long long)H->rows);
        }
        v[i] = ids[i];
        for (int64_t d = 0; d < D; d++) w[i * D + d] = ms_f32_to_bf16(ms_mat_get(H, ids[i], d));
    }
    ms_free_aligned((void *)m->draft_head.data);
    free(m->draft_vocab);
    m->draft_head = ms_mat_whole(MS_DT_BF16, n, D, w, NULL);
    m->draft_vocab = v;
    m->n_draft_vocab = n;
    return 0;
}

int64_t ms_model_draft_vocab(const ms_model *m, const int32_t **ids)
{
    *ids = m->draft_vocab;
    return m->draft_vocab ? m->n_draft_vocab : 0;
}

int ms_model_draft_forward(ms_model *m, const ms_kv_cache *cache, const ms_batch_seq *seqs,
                           int n_seqs, ms_errbuf *err)
{
    if (!ms_model_has_draft(m))
        return ms_err(err, MS_EUNSUPPORTED, "this model has no loaded draft (MTP) layer");
    return m->family->draft(m, cache, seqs, n_seqs, err);
}

int ms_model_kv_spec(const ms_model *m, const ms_kv_spec_opts *o, ms_kv_spec *out, ms_errbuf *err)
{
    return m->family->kv_spec(&m->shape, o, out, err);
}

int ms_model_forward(ms_model *m, const ms_kv_cache *cache, const ms_batch_seq *seqs, int n_seqs,
                     ms_errbuf *err)
{
    const ms_family *f = m->family;
    int rc = f->embed(m, seqs, n_seqs, err);
    if (!rc) rc = f->run_layers(m, cache, seqs, n_seqs, 0, m->shape.n_layers, err);
    if (!rc) rc = f->head(m, seqs, n_seqs, err);
    return rc;
}

struct prepack {
    const ms_kctx *k;
    int64_t n;
    size_t bytes, cap;
    char *base; /* NULL: the sizing pass */
};

static void prepack_view(ms_mat *w, unsigned flags, void *arg)
{
    struct prepack *p = arg;
    /* the LM head sees as many rows as sequences wanting logits, rarely 128 */
    if ((flags & MS_VIEW_LM_HEAD) || !w->data || w->rows <= 0) return;
    if (ms_kernels_dnnl_prepack(p->k, w) == 0) p->n++;
}

static void panel_view(ms_mat *w, unsigned flags, void *arg)
{
    struct prepack *p = arg;
    (void)flags;
    size_t b = (ms_kernels_panels_bytes(p->k, w) + 63) & ~(size_t)63;
    if (!b || p->bytes + b > p->cap) return; /* past the cap: packed at each call */
    if (p->base) {
        ms_kernels_panels_fill(p->k, w, p->base + p->bytes);
        w->panels = p->base + p->bytes;
    }
    p->bytes += b;
    p->n++;
}

int64_t ms_model_prepack(ms_model *m, size_t *bytes)
{
    const char *e = getenv("MOESERVE_PANELS"), *mb = getenv("MOESERVE_PANELS_MB");
    struct prepack p = {&m->kctx, 0, 0, (size_t)(mb && atol(mb) > 0 ? atol(mb) : 4096) << 20, NULL};
    *bytes = 0;
    if (m->panels) return 0; /* made already */
    if (!(e && strcmp(e, "0") == 0)) {
        m->family->each_view(m, panel_view, &p);
        if (p.bytes && (p.base = ms_alloc_aligned(1, p.bytes))) {
            m->panels = p.base;
            p.n = 0, p.bytes = 0;
            m->family->each_view(m, panel_view, &p);
            /* the routed experts read copies of their slots' views: copy again */
            for (int l = 0; l < m->shape.n_layers; l++) ms_model_expert_slots_bind(m, l);
            *bytes = p.bytes;
            return p.n;
        }
        p.n = 0, p.bytes = 0; /* none to make, or no memory for them: oneDNN's copies */
    }
    size_t b0 = ms_kernels_dnnl_bytes();
    m->family->each_view(m, prepack_view, &p);
    *bytes = ms_kernels_dnnl_bytes() - b0;
    return p.n;
}
