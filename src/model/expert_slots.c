/* expert_slots.c — the routed experts of a DeepSeek-V2/V3 rank as physical slots
 * (DESIGN.md §7–8): layer l holds n_slots slots (the EP rank's share of the physical
 * experts, every expert on one rank), slot s holding the logical expert the shard's
 * map puts there, each slot its own copy in the weight arena (replicas on one rank
 * included).  The MoE compute reads experts[] by logical id; a held expert's view is
 * its lowest slot's (the rank's dispatch choice), the others are empty.  EPLB
 * rewrites a slot's bytes at run time (ms_model_expert_slot_write) and then rebinds
 * the layer (ms_model_expert_slots_bind); derived copies of the slot's views (FP8
 * plain-row flags, oneDNN prepacks) are refreshed in place.
 * Not here: the map itself (parallel/ep.h), the moves (serve/eplb_run.c).
 * Main thread only.
 */
#include "base/log.h"
#include "kernels/kernels.h"
#include "model/model.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

int ms_dsv3_slots_init(ms_model *m, ms_layer_w *lw, int layer, ms_errbuf *err)
{
    int n = ms_shard_n_experts(m->shard, m->cfg.n_routed_experts);
    lw->slots = calloc((size_t)n, sizeof *lw->slots);
    if (!lw->slots)
        return ms_err(err, MS_ENOMEM, "out of memory (expert slots of layer %d)", layer);
    lw->n_slots = n;
    for (int s = 0; s < n; s++) lw->slots[s] = lw->experts[ms_shard_expert(m->shard, layer, s)];
    return 0;
}

/* The six pieces of a slot (data, then scales, of gate, up, down) as offsets from
 * the slot's first byte; returns the slot's bytes, 0 when a piece lies before it. */
static size_t slot_layout(const ms_ffn_w *f, size_t off[6])
{
    const ms_mat *v[3] = {&f->gate, &f->up, &f->down};
    const char *base = f->gate.data;
    size_t end = 0;
    for (int i = 0; i < 3; i++) {
        if (v[i]->dtype == MS_DT_F4E2M1) return 0; /* its UE8M0 scales live apart: not built */
        const char *d = v[i]->data, *sc = (const char *)v[i]->scale;
        size_t sb = ms_model_scale_bytes(v[i]);
        if (!d || d < base || (sb && sc < base)) return 0;
        off[2 * i] = (size_t)(d - base);
        off[2 * i + 1] = sb ? (size_t)(sc - base) : 0;
        size_t e = off[2 * i] + ms_model_view_bytes(v[i]);
        end = e > end ? e : end;
        if (sb && off[2 * i + 1] + sb > end) end = off[2 * i + 1] + sb;
    }
    return end;
}

void ms_model_expert_slots_bind(ms_model *m, int layer)
{
    if (m->v4 || layer < 0 || layer >= m->cfg.n_layers + m->cfg.num_nextn_predict_layers) return;
    ms_layer_w *lw = &m->layers[layer];
    if (!lw->is_moe || !lw->slots) return;
    memset(lw->experts, 0, sizeof *lw->experts * (size_t)m->cfg.n_routed_experts);
    for (int s = lw->n_slots - 1; s >= 0; s--) /* the lowest slot of an expert wins */
        lw->experts[ms_shard_expert(m->shard, layer, s)] = lw->slots[s];
}

void ms_dsv3_slots_place(ms_model *m)
{
    int n = m->cfg.n_layers + m->cfg.num_nextn_predict_layers;
    for (int l = 0; l < n; l++) {
        ms_layer_w *lw = &m->layers[l];
        if (!lw->is_moe || !lw->slots) continue;
        ms_model_expert_slots_bind(m, l);
        lw->slot_bytes = 0;
        if (!m->arena) continue; /* the file mapping: read-only */
        size_t off0[6], off[6], b0 = slot_layout(&lw->slots[0], off0);
        int ok = b0 > 0;
        for (int s = 0; ok && s < lw->n_slots; s++) {
            const char *base = lw->slots[s].gate.data;
            ok = slot_layout(&lw->slots[s], off) == b0 && !memcmp(off, off0, sizeof off) &&
                 base >= (const char *)m->arena &&
                 base + b0 <= (const char *)m->arena + m->arena_bytes;
        }
        if (ok) lw->slot_bytes = b0;
    }
}

static ms_layer_w *moe_layer(const ms_model *m, int layer)
{
    if (m->v4 || layer < 0 || layer >= m->cfg.n_layers + m->cfg.num_nextn_predict_layers)
        return NULL;
    ms_layer_w *lw = &m->layers[layer];
    return lw->is_moe && lw->slots ? lw : NULL;
}

int ms_model_expert_slots(const ms_model *m, int layer)
{
    const ms_layer_w *lw = moe_layer(m, layer);
    return lw ? lw->n_slots : 0;
}

size_t ms_model_expert_slot_bytes(const ms_model *m, int layer)
{
    const ms_layer_w *lw = moe_layer(m, layer);
    return lw ? lw->slot_bytes : 0;
}

const void *ms_model_expert_slot_blob(const ms_model *m, int layer, int slot)
{
    const ms_layer_w *lw = moe_layer(m, layer);
    if (!lw || !lw->slot_bytes || slot < 0 || slot >= lw->n_slots) return NULL;
    return lw->slots[slot].gate.data;
}

int ms_model_expert_slot_write(ms_model *m, int layer, int slot, const void *blob, ms_errbuf *err)
{
    ms_layer_w *lw = moe_layer(m, layer);
    if (!lw || !lw->slot_bytes || slot < 0 || slot >= lw->n_slots)
        return ms_err(err, MS_EINTERNAL, "layer %d slot %d is not a rewritable expert slot", layer,
                      slot);
    ms_ffn_w *f = &lw->slots[slot];
    ms_mat *v[3] = {&f->gate, &f->up, &f->down};
    if (mprotect(m->arena, m->arena_bytes, PROT_READ | PROT_WRITE))
        return ms_err(err, MS_EINTERNAL, "cannot make the weight arena writable");
    memcpy((void *)f->gate.data, blob, lw->slot_bytes);
    (void)mprotect(m->arena, m->arena_bytes, PROT_READ);
    for (int i = 0; i < 3; i++) {
        if (v[i]->f8_plain) ms_mat_f8_scan(v[i], (uint8_t *)v[i]->f8_plain); /* m->f8_plain's */
        if (v[i]->panels) ms_kernels_panels_fill(&m->kctx, v[i], (void *)v[i]->panels);
        (void)ms_kernels_dnnl_refresh(&m->kctx, v[i]); /* none held: taken at first use */
    }
    return 0;
}
