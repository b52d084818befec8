/* wire.c — encode/decode of one ms_req_params record (wire.h).  Every field is
 * written explicitly in a fixed order, so the record does not depend on struct
 * padding; decoding checks the magic, the version and every count before use. */
#include "serve/wire.h"

#include <stdlib.h>
#include <string.h>

#define WIRE_MAGIC 0x5152534du /* "MSRQ" */
#define HDR_BYTES  16          /* magic, version, header bytes, record bytes */
#define FIXED_BYTES                                                                                \
    (HDR_BYTES + 8 /* id */ + 8 /* seed */ + 8 /* n_ids */ + 8 /* max_new */ + 8 /* min_new */ +   \
     4 * 6 /* dp_rank, ignore_eos, top_logprobs, n_stop, top_k, n_bias */ +                        \
     4 * 6 /* temperature, top_p, min_p, frequency, presence, repetition */)

struct cursor {
    uint8_t *w;       /* writing */
    const uint8_t *r; /* reading */
};

static void put(struct cursor *c, const void *v, size_t n)
{
    memcpy(c->w, v, n);
    c->w += n;
}

static void get(struct cursor *c, void *v, size_t n)
{
    memcpy(v, c->r, n);
    c->r += n;
}

void ms_req_params_init(ms_req_params *p)
{
    memset(p, 0, sizeof *p);
    p->max_new = 128;
    p->samp = (ms_sampler_params){
        .temperature = 1.0f, .top_p = 1.0f, .top_k = -1, .repetition_penalty = 1.0f};
    p->top_logprobs = -1;
    p->dp_rank = -1;
}

size_t ms_wire_req_size(const ms_req_params *p)
{
    int ns = p->n_stop_ids < 0 ? 0 : p->n_stop_ids;
    int64_t ni = p->n_ids < 0 ? 0 : p->n_ids;
    int nb = p->n_bias < 0 ? 0 : p->n_bias;
    return FIXED_BYTES + 4 * (size_t)ns + 8 * (size_t)nb + 4 * (size_t)ni;
}

int ms_wire_req_encode(const ms_req_params *p, void *buf, size_t cap, ms_errbuf *err)
{
    if (p->n_ids < 0 || p->n_ids > MS_REQ_MAX_IDS || (p->n_ids > 0 && !p->ids))
        return ms_err(err, MS_EINVAL, "request %llu: %lld prompt ids (at most %d)",
                      (unsigned long long)p->id, (long long)p->n_ids, MS_REQ_MAX_IDS);
    if (p->n_stop_ids < 0 || p->n_stop_ids > MS_REQ_MAX_STOP_IDS)
        return ms_err(err, MS_EINVAL, "request %llu: %d stop ids (at most %d)",
                      (unsigned long long)p->id, p->n_stop_ids, MS_REQ_MAX_STOP_IDS);
    if (p->n_bias < 0 || p->n_bias > MS_REQ_MAX_LOGIT_BIAS)
        return ms_err(err, MS_EINVAL, "request %llu: %d logit_bias entries (at most %d)",
                      (unsigned long long)p->id, p->n_bias, MS_REQ_MAX_LOGIT_BIAS);
    uint64_t total = ms_wire_req_size(p);
    if (total > cap)
        return ms_err(err, MS_EINVAL, "request record needs %llu bytes", (unsigned long long)total);
    struct cursor c = {.w = buf};
    uint32_t magic = WIRE_MAGIC;
    uint16_t ver = MS_WIRE_VERSION, hdr = FIXED_BYTES;
    int32_t i32[6] = {p->dp_rank,    p->ignore_eos, p->top_logprobs,
                      p->n_stop_ids, p->samp.top_k, p->n_bias};
    float f32[6] = {p->samp.temperature,
                    p->samp.top_p,
                    p->samp.min_p,
                    p->samp.frequency_penalty,
                    p->samp.presence_penalty,
                    p->samp.repetition_penalty};
    put(&c, &magic, 4);
    put(&c, &ver, 2);
    put(&c, &hdr, 2);
    put(&c, &total, 8);
    put(&c, &p->id, 8);
    put(&c, &p->seed, 8);
    put(&c, &p->n_ids, 8);
    put(&c, &p->max_new, 8);
    put(&c, &p->min_new, 8);
    put(&c, i32, sizeof i32);
    put(&c, f32, sizeof f32);
    put(&c, p->stop_ids, 4 * (size_t)p->n_stop_ids);
    put(&c, p->bias_ids, 4 * (size_t)p->n_bias);
    put(&c, p->bias, 4 * (size_t)p->n_bias);
    if (p->n_ids > 0) put(&c, p->ids, 4 * (size_t)p->n_ids);
    return 0;
}

int ms_wire_req_decode(const void *buf, size_t len, ms_req_params *out, int32_t **ids,
                       int64_t *cap_ids, size_t *used, ms_errbuf *err)
{
    memset(out, 0, sizeof *out);
    if (len < HDR_BYTES)
        return ms_err(err, MS_EINVAL, "request record: %zu bytes, short of its header", len);
    struct cursor c = {.r = buf};
    uint32_t magic;
    uint16_t ver, hdr;
    uint64_t total;
    get(&c, &magic, 4);
    get(&c, &ver, 2);
    get(&c, &hdr, 2);
    get(&c, &total, 8);
    if (magic != WIRE_MAGIC)
        return ms_err(err, MS_EINVAL, "request record: bad magic 0x%08x", magic);
    if (ver != MS_WIRE_VERSION)
        return ms_err(err, MS_EINVAL,
                      "request record of wire version %u: this build reads version %u only "
                      "(mixed moeserve builds?)",
                      ver, MS_WIRE_VERSION);
    if (hdr != FIXED_BYTES || total < FIXED_BYTES || total > len)
        return ms_err(err, MS_EINVAL, "request record: %llu bytes (header %u) in %zu available",
                      (unsigned long long)total, hdr, len);
    int32_t i32[6];
    float f32[6];
    get(&c, &out->id, 8);
    get(&c, &out->seed, 8);
    get(&c, &out->n_ids, 8);
    get(&c, &out->max_new, 8);
    get(&c, &out->min_new, 8);
    get(&c, i32, sizeof i32);
    get(&c, f32, sizeof f32);
    out->dp_rank = i32[0];
    out->ignore_eos = i32[1];
    out->top_logprobs = i32[2];
    out->n_stop_ids = i32[3];
    out->n_bias = i32[5];
    out->samp = (ms_sampler_params){.temperature = f32[0],
                                    .top_p = f32[1],
                                    .top_k = i32[4],
                                    .min_p = f32[2],
                                    .frequency_penalty = f32[3],
                                    .presence_penalty = f32[4],
                                    .repetition_penalty = f32[5]};
    if (out->n_stop_ids < 0 || out->n_stop_ids > MS_REQ_MAX_STOP_IDS || out->n_bias < 0 ||
        out->n_bias > MS_REQ_MAX_LOGIT_BIAS || out->n_ids < 0 || out->n_ids > MS_REQ_MAX_IDS ||
        total != FIXED_BYTES + 4 * (uint64_t)out->n_stop_ids + 8 * (uint64_t)out->n_bias +
                     4 * (uint64_t)out->n_ids)
        return ms_err(err, MS_EINVAL,
                      "request record: %lld ids, %d stop ids and %d logit_bias entries do not "
                      "match its %llu bytes",
                      (long long)out->n_ids, out->n_stop_ids, out->n_bias,
                      (unsigned long long)total);
    get(&c, out->stop_ids, 4 * (size_t)out->n_stop_ids);
    get(&c, out->bias_ids, 4 * (size_t)out->n_bias);
    get(&c, out->bias, 4 * (size_t)out->n_bias);
    if (out->n_ids > *cap_ids) {
        int32_t *p = realloc(*ids, sizeof(int32_t) * (size_t)out->n_ids);
        if (!p)
            return ms_err(err, MS_ENOMEM, "out of memory for %lld prompt ids",
                          (long long)out->n_ids);
        *ids = p;
        *cap_ids = out->n_ids;
    }
    if (out->n_ids > 0) get(&c, *ids, 4 * (size_t)out->n_ids);
    out->ids = *ids;
    *used = (size_t)total;
    return 0;
}
