/* test_wire.c — serve/wire: every field of ms_req_params survives encode/decode,
 * records follow each other in one buffer, and a record of another version, a
 * truncated one or one whose counts disagree with its length is refused. */
#include "harness.h"
#include "serve/wire.h"

#include <stdlib.h>
#include <string.h>

static ms_req_params sample(const int32_t *ids, int64_t n)
{
    ms_req_params p = {.id = 0x1122334455667788ull,
                       .ids = ids,
                       .n_ids = n,
                       .max_new = 4097,
                       .seed = 0xfedcba9876543210ull,
                       .ignore_eos = 1,
                       .n_stop_ids = 3,
                       .top_logprobs = 7,
                       .dp_rank = 5};
    p.samp = (ms_sampler_params){.temperature = 0.7f,
                                 .top_p = 0.9f,
                                 .top_k = 40,
                                 .min_p = 0.05f,
                                 .frequency_penalty = -1.5f,
                                 .presence_penalty = 0.25f,
                                 .repetition_penalty = 1.1f};
    p.stop_ids[0] = 2;
    p.stop_ids[1] = 99999;
    p.stop_ids[2] = -7;
    p.min_new = 12;
    p.n_bias = 2;
    p.bias_ids[0] = 17;
    p.bias[0] = -100.0f;
    p.bias_ids[1] = 3;
    p.bias[1] = 2.5f;
    return p;
}

static int same(const ms_req_params *a, const ms_req_params *b)
{
    return a->id == b->id && a->n_ids == b->n_ids && a->max_new == b->max_new &&
           a->seed == b->seed && a->ignore_eos == b->ignore_eos && a->n_stop_ids == b->n_stop_ids &&
           !memcmp(a->stop_ids, b->stop_ids, sizeof(int32_t) * (size_t)a->n_stop_ids) &&
           a->top_logprobs == b->top_logprobs && a->dp_rank == b->dp_rank &&
           a->min_new == b->min_new && a->n_bias == b->n_bias &&
           !memcmp(a->bias_ids, b->bias_ids, sizeof(int32_t) * (size_t)a->n_bias) &&
           !memcmp(a->bias, b->bias, sizeof(float) * (size_t)a->n_bias) &&
           a->samp.temperature == b->samp.temperature && a->samp.top_p == b->samp.top_p &&
           a->samp.top_k == b->samp.top_k && a->samp.min_p == b->samp.min_p &&
           a->samp.frequency_penalty == b->samp.frequency_penalty &&
           a->samp.presence_penalty == b->samp.presence_penalty &&
           a->samp.repetition_penalty == b->samp.repetition_penalty &&
           (a->n_ids == 0 || !memcmp(a->ids, b->ids, sizeof(int32_t) * (size_t)a->n_ids));
}

TEST(round_trip_every_field)
{
    int32_t ids[5] = {0, 17, -1, 2147483647, 12};
    ms_req_params p = sample(ids, 5), q;
    size_t n = ms_wire_req_size(&p), used = 0;
    uint8_t *buf = malloc(n + 1); /* +1: decode from an odd address too */
    int32_t *scratch = NULL;
    int64_t cap = 0;
    ms_errbuf err = {{0}};
    CHECK(buf);
    CHECK(ms_wire_req_encode(&p, buf + 1, n, &err) == 0);
    CHECKF(ms_wire_req_decode(buf + 1, n, &q, &scratch, &cap, &used, &err) == 0, "%s", err.msg);
    CHECK(used == n);
    CHECK(same(&p, &q));
    CHECK(q.ids == scratch && cap >= 5);
    /* each field on its own: changing it changes the decoded value */
    ms_req_params v[14];
    for (int i = 0; i < 14; i++) v[i] = p;
    v[0].id ^= 1;
    v[1].max_new++;
    v[2].seed ^= 1ull << 63;
    v[3].ignore_eos = 0;
    v[4].n_stop_ids = 0;
    v[5].top_logprobs = -1;
    v[6].dp_rank = -1;
    v[7].samp.top_k = -1;
    v[8].samp.repetition_penalty = 1;
    v[9].n_ids = 2;
    v[10].samp.min_p = 0;
    v[11].min_new = 0;
    v[12].n_bias = 1;
    v[13].bias[1] = 0;
    for (int i = 0; i < 14; i++) {
        CHECK(!same(&v[i], &p));
        size_t m = ms_wire_req_size(&v[i]);
        uint8_t *b2 = malloc(m);
        CHECK(b2);
        CHECK(ms_wire_req_encode(&v[i], b2, m, &err) == 0);
        int rc = ms_wire_req_decode(b2, m, &q, &scratch, &cap, &used, &err);
        free(b2);
        CHECKF(rc == 0 && same(&v[i], &q), "variant %d", i);
    }
    free(buf);
    free(scratch);
}

TEST(records_in_sequence_and_empty_ids)
{
    int32_t a[3] = {1, 2, 3};
    ms_req_params p = sample(a, 3), r = sample(NULL, 0), q;
    r.n_stop_ids = MS_REQ_MAX_STOP_IDS;
    for (int i = 0; i < MS_REQ_MAX_STOP_IDS; i++) r.stop_ids[i] = 100 + i;
    size_t n1 = ms_wire_req_size(&p), n2 = ms_wire_req_size(&r), used;
    uint8_t *buf = malloc(n1 + n2);
    int32_t *scratch = NULL;
    int64_t cap = 0;
    ms_errbuf err = {{0}};
    CHECK(buf);
    CHECK(ms_wire_req_encode(&p, buf, n1, &err) == 0 &&
          ms_wire_req_encode(&r, buf + n1, n2, &err) == 0);
    CHECK(ms_wire_req_decode(buf, n1 + n2, &q, &scratch, &cap, &used, &err) == 0 && used == n1);
    CHECK(same(&p, &q));
    CHECK(ms_wire_req_decode(buf + n1, n2, &q, &scratch, &cap, &used, &err) == 0 && used == n2);
    CHECK(same(&r, &q));
    free(buf);
    free(scratch);
}

TEST(version_mismatch_refused)
{
    int32_t ids[2] = {4, 5};
    ms_req_params p = sample(ids, 2), q;
    size_t n = ms_wire_req_size(&p), used;
    uint8_t *buf = malloc(n);
    int32_t *scratch = NULL;
    int64_t cap = 0;
    ms_errbuf err = {{0}};
    CHECK(buf);
    CHECK(ms_wire_req_encode(&p, buf, n, &err) == 0);
    uint16_t v = MS_WIRE_VERSION + 1;
    memcpy(buf + 4, &v, 2); /* the version follows the magic */
    CHECK(ms_wire_req_decode(buf, n, &q, &scratch, &cap, &used, &err) == MS_EINVAL);
    char want[64], have[64];
    snprintf(want, sizeof want, "version %d:", MS_WIRE_VERSION + 1);
    snprintf(have, sizeof have, "reads version %d", MS_WIRE_VERSION);
    CHECKF(strstr(err.msg, want) && strstr(err.msg, have), "%s", err.msg);
    free(buf);
    free(scratch);
}

TEST(malformed_refused)
{
    int32_t ids[4] = {4, 5, 6, 7};
    ms_req_params p = sample(ids, 4), q;
    size_t n = ms_wire_req_size(&p), used;
    uint8_t *buf = malloc(n);
    int32_t *scratch = NULL;
    int64_t cap = 0;
    ms_errbuf err = {{0}};
    CHECK(buf);
    CHECK(ms_wire_req_encode(&p, buf, n, &err) == 0);
    for (size_t cut = 0; cut < n; cut += 3) /* every truncation */
        CHECKF(ms_wire_req_decode(buf, cut, &q, &scratch, &cap, &used, &err) == MS_EINVAL,
               "cut %zu", cut);
    uint8_t save = buf[0];
    buf[0] ^= 0xff; /* magic */
    CHECK(ms_wire_req_decode(buf, n, &q, &scratch, &cap, &used, &err) == MS_EINVAL);
    buf[0] = save;
    int64_t more = 5; /* n_ids no longer matches the record's length */
    memcpy(buf + 16 + 16, &more, 8);
    CHECK(ms_wire_req_decode(buf, n, &q, &scratch, &cap, &used, &err) == MS_EINVAL);
    /* the encoder refuses counts out of range */
    p.n_stop_ids = MS_REQ_MAX_STOP_IDS + 1;
    CHECK(ms_wire_req_encode(&p, buf, n, &err) == MS_EINVAL);
    p.n_stop_ids = 1;
    CHECK(ms_wire_req_encode(&p, buf, ms_wire_req_size(&p) - 1, &err) == MS_EINVAL);
    free(buf);
    free(scratch);
}

/* The front end starts every request from these (serve/openai.c, http.c). */
TEST(params_defaults)
{
    ms_req_params p;
    memset(&p, 0x5a, sizeof p);
    ms_req_params_init(&p);
    CHECK(p.max_new == 128 && p.top_logprobs == -1 && p.dp_rank == -1);
    CHECK(p.samp.temperature == 1.0f && p.samp.top_p == 1.0f && p.samp.top_k == -1);
    CHECK(p.samp.repetition_penalty == 1.0f && p.samp.min_p == 0 && p.samp.presence_penalty == 0);
    CHECK(p.n_stop_ids == 0 && p.n_bias == 0 && p.min_new == 0 && !p.ignore_eos && !p.ids);
}

int main(void)
{
    RUN(round_trip_every_field);
    RUN(records_in_sequence_and_empty_ids);
    RUN(version_mismatch_refused);
    RUN(malformed_refused);
    RUN(params_defaults);
    return TEST_REPORT();
}
