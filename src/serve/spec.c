/* spec.c — speculative decoding on one rank of the engine: the launch flags
 * checked and turned into the scheduler's draft settings, and the draft chain
 * of the checkpoint's MTP layer (EAGLE/NEXTN/MTP: SGLang's names for it).
 *
 * After each step's commit every rank runs the chain in lockstep: the draft
 * layer's extend over the positions the target just accepted (the target's
 * hidden states after its final norm, the tokens after them), then S - 1
 * single-token steps fed the draft layer's own hidden state (after
 * shared_head.norm) and its argmax, as SGLang's deepseek_nextn and EAGLE
 * worker do.  DeepSeek-V4's MTP block reads and returns hc_mult residual
 * streams instead (before hc_head, as the official MTPBlock).  Each round's batch goes from the
 * attention-TP leader to its group (tokens, positions, page ids, hidden rows) and the token counts
 * are all-gathered as for the main forward, so the draft layer's attention TP and MoE collectives
 * see every rank.  NGRAM drafts are the scheduler's own.  Verification and acceptance: scheduler.c
 * and sample.c. Main thread only.
 */
#include "serve/engine_priv.h"

#include "base/log.h"
#include "base/util.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

struct ms_spec {
    int steps;             /* S */
    int mtp;               /* 1: the MTP chain runs here */
    int cap;               /* jobs (max_running + 1) */
    int64_t D, V;          /* D: a hidden row's floats (ms_model_draft_hidden_width) */
    int64_t Vd;            /* the draft head's width: V, or the token map's size */
    const int32_t *vocab;  /* [Vd] the token map's ids; NULL: column j is token j */
    ms_batch_seq *seqs;    /* [cap] one round's batch */
    int32_t *tok;          /* [cap] chain tokens (the last draft of each job) */
    int32_t *drafts;       /* [cap][S] */
    float *logits;         /* [cap][V] */
    float *hid, *hid_next; /* [cap][D] the chain's hidden rows, in and out */
    int *job_of;           /* [cap] the job of each round's sequence */
    ms_batch_seq *cnt;     /* [cap_cnt] a round's rows as the draft's MoE sees them */
    int cap_cnt;
    /* attention-TP members: the leader's round, received */
    ms_batch_seq *mseqs;
    ms_kv_seq *mkv;
    int cap_m;
    float **mlog; /* [cap_mlog] members' logit rows (ms_engine_member_logits) */
    int cap_mlog;
    uint8_t *buf;
    size_t cap_buf;
};

/* --speculative-token-map: token ids as text (SGLang's file is a torch .pt of
 * them, which needs Python to read), separated by whitespace or commas; no
 * id twice.  Sets the draft head to those rows. */
static int load_token_map(ms_engine *e, const char *path, int64_t V, ms_errbuf *err)
{
    size_t n = strlen(path);
    if (n > 3 && !strcasecmp(path + n - 3, ".pt"))
        return ms_err(err, MS_EUNSUPPORTED,
                      "--speculative-token-map %s: a PyTorch file cannot be read here; give the "
                      "hot token ids as text (e.g. python3 -c 'import torch,sys; "
                      "print(*torch.load(sys.argv[1]).tolist())' %s > map.txt)",
                      path, path);
    char *buf = NULL;
    size_t len = 0;
    if (ms_read_file(path, (size_t)1 << 26, &buf, &len))
        return ms_err(err, MS_EIO, "--speculative-token-map %s: cannot read it", path);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)V);
    uint8_t *seen = calloc((size_t)V, 1);
    int64_t k = 0;
    int rc = ids && seen ? 0 : ms_err(err, MS_ENOMEM, "out of memory");
    for (char *p = buf; !rc && p < buf + len;) {
        if (*p == ' ' || *p == '\n' || *p == '\t' || *p == '\r' || *p == ',') {
            p++;
            continue;
        }
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 0 || v >= V)
            rc = ms_err(err, MS_EINVAL,
                        "--speculative-token-map %s: byte %ld: expected a token "
                        "id in [0, %lld)",
                        path, (long)(p - buf), (long long)V);
        else if (seen[v])
            rc = ms_err(err, MS_EINVAL, "--speculative-token-map %s: token %ld twice", path, v);
        else
            seen[v] = 1, ids[k++] = (int32_t)v, p = end;
    }
    if (!rc && k == 0) rc = ms_err(err, MS_EINVAL, "--speculative-token-map %s: no ids", path);
    if (!rc) rc = ms_model_set_draft_vocab(e->m, ids, k, err);
    free(buf);
    free(ids);
    free(seen);
    return rc;
}

/* The draft's token from its logits row (the argmax; through the token map). */
static int32_t draft_token(const struct ms_spec *sp, const float *logits)
{
    int32_t j = ms_sampler_argmax(logits, sp->Vd);
    return sp->vocab ? sp->vocab[j] : j;
}

int ms_engine_spec_open(ms_engine *e, const ms_model_shape *shape, ms_errbuf *err)
{
    const ms_launch *l = &e->o.launch;
    int S = l->speculative_num_steps > 0 ? l->speculative_num_steps : 3;
    if (l->spec == MS_SPEC_NONE) return 0;
    if (l->spec == MS_SPEC_DSPARK)
        return ms_err(err, MS_EUNSUPPORTED,
                      "--speculative-algorithm DSPARK: not implemented (the DSpark draft head "
                      "ships with the DeepSeek-V4 0731/0813 checkpoints of the V4.1 line, whose "
                      "model family is not built)");
    if (l->speculative_eagle_topk > 1)
        return ms_err(err, MS_EUNSUPPORTED,
                      "--speculative-eagle-topk %d: not implemented (draft trees; chains only, "
                      "--speculative-eagle-topk 1)",
                      l->speculative_eagle_topk);
    if (l->ngram_bfs_breadth > 1)
        return ms_err(err, MS_EUNSUPPORTED,
                      "--speculative-ngram-max-bfs-breadth %d: not implemented (n-gram trees; "
                      "chains only, 1)",
                      l->ngram_bfs_breadth);
    if (l->speculative_num_draft_tokens > 0 && l->speculative_num_draft_tokens != S + 1)
        return ms_err(err, MS_EUNSUPPORTED,
                      "--speculative-num-draft-tokens %d with --speculative-num-steps %d: a chain "
                      "verifies num-steps + 1 = %d tokens (other values need draft trees, not "
                      "implemented)",
                      l->speculative_num_draft_tokens, S, S + 1);
    if (l->spec == MS_SPEC_EAGLE && shape->attn != MS_ATTN_MLA && shape->attn != MS_ATTN_V4)
        return ms_err(
            err, MS_EUNSUPPORTED,
            "--speculative-algorithm EAGLE: the MTP draft of %s is not built (DeepSeek-V3 "
            "and V4 families only)",
            shape->name);
    int max_S = ms_model_max_spec_steps(e->m);
    if (max_S > 0 && S > max_S)
        return ms_err(err, MS_EUNSUPPORTED,
                      "--speculative-num-steps %d: %s verifies at most %d draft tokens (its "
                      "compressor state keeps %d rows for rejected drafts)",
                      S, shape->name, max_S, max_S);
    if (l->spec == MS_SPEC_EAGLE && !ms_model_has_draft(e->m))
        return ms_err(err, MS_EUNSUPPORTED,
                      "--speculative-algorithm EAGLE: %s has no MTP layer with its enorm, hnorm, "
                      "eh_proj and shared_head.norm (num_nextn_predict_layers %d)",
                      e->o.model_path, shape->n_mtp_layers);
    if (l->speculative_token_map[0] && l->spec != MS_SPEC_EAGLE)
        return ms_err(err, MS_EUNSUPPORTED,
                      "--speculative-token-map: only for the MTP draft's "
                      "head (--speculative-algorithm EAGLE|NEXTN|MTP)");
    struct ms_spec *sp = calloc(1, sizeof *sp);
    if (!sp) return ms_err(err, MS_ENOMEM, "out of memory");
    e->spec = sp;
    sp->steps = S;
    sp->mtp = l->spec == MS_SPEC_EAGLE;
    sp->cap = e->max_running_rank + 1;
    sp->D = ms_model_draft_hidden_width(e->m); /* V4: hc_mult streams */
    sp->V = shape->vocab;
    int rc;
    if (l->speculative_token_map[0] &&
        (rc = load_token_map(e, l->speculative_token_map, sp->V, err)))
        return rc;
    sp->Vd = ms_model_draft_vocab(e->m, &sp->vocab);
    if (sp->Vd == 0) sp->Vd = sp->V;
    if (sp->mtp) {
        sp->seqs = calloc((size_t)sp->cap, sizeof *sp->seqs);
        sp->tok = calloc((size_t)sp->cap, sizeof *sp->tok);
        sp->drafts = calloc((size_t)sp->cap * (size_t)S, sizeof *sp->drafts);
        sp->job_of = calloc((size_t)sp->cap, sizeof *sp->job_of);
        sp->logits = ms_alloc_aligned((size_t)(sp->cap * sp->V), sizeof(float));
        sp->hid = ms_alloc_aligned((size_t)(sp->cap * sp->D), sizeof(float));
        sp->hid_next = ms_alloc_aligned((size_t)(sp->cap * sp->D), sizeof(float));
        if (!sp->seqs || !sp->tok || !sp->drafts || !sp->job_of || !sp->logits || !sp->hid ||
            !sp->hid_next)
            return ms_err(err, MS_ENOMEM, "out of memory (draft buffers)");
    }
    if (e->rank == 0)
        MS_LOG(MS_INFO, "spec",
               "speculative decoding: %s, %d steps, %d draft tokens per verify, draft head over "
               "%lld of %lld tokens",
               sp->mtp ? "EAGLE (the checkpoint's MTP layer)" : "NGRAM (prompt lookup)", S, S + 1,
               (long long)(sp->mtp ? sp->Vd : 0), (long long)sp->V);
    return 0;
}

void ms_engine_spec_free(ms_engine *e)
{
    struct ms_spec *sp = e->spec;
    if (!sp) return;
    free(sp->seqs);
    free(sp->tok);
    free(sp->drafts);
    free(sp->job_of);
    free(sp->cnt);
    ms_free_aligned(sp->logits);
    ms_free_aligned(sp->hid);
    ms_free_aligned(sp->hid_next);
    free(sp->mseqs);
    free(sp->mkv);
    free(sp->mlog);
    free(sp->buf);
    free(sp);
    e->spec = NULL;
}

int ms_engine_spec_steps(const ms_engine *e)
{
    return e->spec ? e->spec->steps : 0;
}
int ms_engine_spec_mtp(const ms_engine *e)
{
    return e->spec ? e->spec->mtp : 0;
}

static int grow_buf(struct ms_spec *sp, size_t n)
{
    if (n <= sp->cap_buf) return 0;
    void *p = realloc(sp->buf, n);
    if (!p) return MS_ENOMEM;
    sp->buf = p;
    sp->cap_buf = n;
    return 0;
}

/* One round's batch from the attention-TP leader to its group: per sequence
 * n_tokens, start_pos, pages, kind, logit rows (a split LM head's members compute a vocab
 * slice of them); then its tokens, page ids and hidden_in rows. */
enum { META = 5 };
static int share_round(ms_engine *e, const ms_batch_seq **seqs, int *n, ms_errbuf *err)
{
    struct ms_spec *sp = e->spec;
    ms_group *g = e->gs.attn_tp;
    int64_t ps = e->o.page_size, hdr[3] = {0, 0, 0}; /* seqs, tokens, pages */
    if (e->is_leader) {
        hdr[0] = *n;
        for (int i = 0; i < *n; i++) {
            hdr[1] += (*seqs)[i].n_tokens;
            hdr[2] += ((*seqs)[i].start_pos + (*seqs)[i].n_tokens + ps - 1) / ps;
        }
    }
    int rc = ms_comm_bcast(g, hdr, sizeof hdr, 0, err);
    if (rc || hdr[0] == 0) {
        if (!e->is_leader) *n = 0;
        return rc;
    }
    size_t bytes = sizeof(int64_t) * META * (size_t)hdr[0] +
                   sizeof(int32_t) * (size_t)(hdr[1] + hdr[2]) +
                   sizeof(float) * (size_t)(hdr[1] * sp->D);
    if (grow_buf(sp, bytes)) return ms_err(err, MS_ENOMEM, "out of memory");
    int64_t *meta = (int64_t *)sp->buf;
    int32_t *ip = (int32_t *)(meta + META * hdr[0]);
    float *fp = (float *)(ip + hdr[1] + hdr[2]);
    if (e->is_leader)
        for (int i = 0; i < *n; i++) {
            const ms_batch_seq *b = &(*seqs)[i];
            int64_t np = (b->start_pos + b->n_tokens + ps - 1) / ps;
            int64_t *mi = meta + META * i;
            mi[0] = b->n_tokens, mi[1] = b->start_pos, mi[2] = np, mi[3] = b->kind;
            mi[4] =
                !b->logits || b->n_tokens <= 0 ? 0 : MS_MIN(MS_MAX(b->n_logits, 1), b->n_tokens);
            memcpy(ip, b->tokens, sizeof(int32_t) * (size_t)b->n_tokens);
            ip += b->n_tokens;
            memcpy(ip, b->kv->pages[0], sizeof(int32_t) * (size_t)np);
            ip += np;
            memcpy(fp, b->hidden_in, sizeof(float) * (size_t)(b->n_tokens * sp->D));
            fp += b->n_tokens * sp->D;
        }
    if ((rc = ms_comm_bcast(g, sp->buf, bytes, 0, err)) || e->is_leader) return rc;
    if ((int)hdr[0] > sp->cap_m) {
        free(sp->mseqs);
        free(sp->mkv);
        sp->mseqs = calloc((size_t)hdr[0], sizeof *sp->mseqs);
        sp->mkv = calloc((size_t)hdr[0], sizeof *sp->mkv);
        sp->cap_m = sp->mseqs && sp->mkv ? (int)hdr[0] : 0;
        if (!sp->cap_m) return ms_err(err, MS_ENOMEM, "out of memory");
    }
    if ((int)hdr[0] > sp->cap_mlog) {
        free(sp->mlog);
        sp->mlog = calloc((size_t)hdr[0], sizeof *sp->mlog);
        sp->cap_mlog = sp->mlog ? (int)hdr[0] : 0;
        if (!sp->mlog) return ms_err(err, MS_ENOMEM, "out of memory");
    }
    if ((rc = ms_engine_member_logits(e, meta + 4, (int)hdr[0], META, sp->mlog, err))) return rc;
    for (int i = 0; i < (int)hdr[0]; i++) {
        ms_batch_seq *b = &sp->mseqs[i];
        const int64_t *mi = meta + META * i;
        memset(b, 0, sizeof *b);
        b->n_tokens = (int32_t)mi[0];
        b->start_pos = mi[1];
        b->kind = (int32_t)mi[3];
        b->logits = sp->mlog[i]; /* NULL, or a split head's scratch (sampling on the leader) */
        b->n_logits = (int32_t)mi[4];
        b->tokens = ip;
        ip += b->n_tokens;
        ms_kv_seq *kv = &sp->mkv[i]; /* a view of the leader's page ids */
        ms_kv_seq_init(kv);
        kv->pages[0] = ip;
        kv->n_pages[0] = kv->cap_pages[0] = mi[2];
        kv->n_tokens = b->start_pos + b->n_tokens;
        b->kv = kv;
        ip += mi[2];
        b->hidden_in = fp;
        fp += b->n_tokens * sp->D;
    }
    *seqs = sp->mseqs;
    *n = (int)hdr[0];
    return 0;
}

/* One round on every rank: share, count, run the draft layer.  The counts are
 * of the rows the draft's MoE sees (ms_draft_out_rows: at least one for each
 * sequence with tokens, so a rank with cache writes to do still runs). */
static int round_fwd(ms_engine *e, const ms_batch_seq *seqs, int n, int64_t *all_rows,
                     ms_errbuf *err)
{
    struct ms_spec *sp = e->spec;
    int rc;
    if (e->W > 1 && e->lay.attn_tp > 1 && (rc = share_round(e, &seqs, &n, err))) return rc;
    if (n > sp->cap_cnt) {
        free(sp->cnt);
        sp->cnt = calloc((size_t)n, sizeof *sp->cnt);
        sp->cap_cnt = sp->cnt ? n : 0;
        if (!sp->cnt) return ms_err(err, MS_ENOMEM, "out of memory");
    }
    for (int i = 0; i < n; i++) sp->cnt[i].n_tokens = ms_draft_out_rows(&seqs[i]);
    int64_t replica_rows, all_dec;
    if ((rc = ms_engine_count_rows(e, sp->cnt, n, &replica_rows, all_rows, &all_dec, err)))
        return rc;
    if (replica_rows > 0 && (rc = ms_model_draft_forward(e->m, e->cache, seqs, n, err))) return rc;
    return 0;
}

int ms_engine_spec_draft(ms_engine *e, ms_errbuf *err)
{
    struct ms_spec *sp = e->spec;
    if (!sp || !sp->mtp) return 0;
    ms_sched_draft *jobs = NULL;
    int nj = e->is_leader ? ms_sched_drafts(e->sched, &jobs) : 0, n = 0, rc;
    /* round 1: the extend over the accepted positions; its last row drafts d1 */
    for (int j = 0; j < nj && n < sp->cap; j++) {
        ms_batch_seq *b = &sp->seqs[n];
        *b = jobs[j].seq;
        if (jobs[j].want > 0) {
            b->logits = sp->logits + (int64_t)n * sp->V;
            b->n_logits = 1;
            b->hidden = sp->hid_next + (int64_t)n * sp->D;
        }
        sp->job_of[n++] = j;
    }
    int64_t all_rows = 0;
    if ((rc = round_fwd(e, sp->seqs, n, &all_rows, err))) return rc;
    if (all_rows == 0) return 0;
    int m = 0; /* the jobs that go on drafting, packed */
    for (int i = 0; i < n; i++) {
        int j = sp->job_of[i];
        if (jobs[j].want <= 0) continue;
        sp->tok[m] = draft_token(sp, sp->logits + (int64_t)i * sp->V);
        sp->drafts[(int64_t)j * sp->steps] = sp->tok[m];
        memcpy(sp->hid + (int64_t)m * sp->D, sp->hid_next + (int64_t)i * sp->D,
               sizeof(float) * (size_t)sp->D);
        sp->job_of[m++] = j;
    }
    /* rounds 2..S: one position each, fed the draft layer's own state and token */
    for (int k = 2; k <= sp->steps; k++) {
        int n2 = 0;
        for (int i = 0; i < m; i++) {
            int j = sp->job_of[i];
            if (jobs[j].want < k) continue;
            ms_batch_seq *b = &sp->seqs[n2];
            memset(b, 0, sizeof *b);
            b->tokens = &sp->tok[i];
            b->n_tokens = 1;
            b->start_pos = jobs[j].seq.start_pos + jobs[j].seq.n_tokens + k - 2;
            b->kv = jobs[j].seq.kv;
            b->kind = MS_SEQ_DECODE;
            b->hidden_in = sp->hid + (int64_t)i * sp->D;
            b->logits = sp->logits + (int64_t)n2 * sp->V;
            b->n_logits = 1;
            b->hidden = sp->hid_next + (int64_t)n2 * sp->D;
            n2++;
        }
        if ((rc = round_fwd(e, sp->seqs, n2, &all_rows, err))) return rc;
        if (all_rows == 0) break;
        int m2 = 0, i2 = 0;
        for (int i = 0; i < m; i++) {
            int j = sp->job_of[i];
            if (jobs[j].want < k) continue;
            sp->tok[m2] = draft_token(sp, sp->logits + (int64_t)i2 * sp->V);
            sp->drafts[(int64_t)j * sp->steps + k - 1] = sp->tok[m2];
            memmove(sp->hid + (int64_t)m2 * sp->D, sp->hid_next + (int64_t)i2 * sp->D,
                    sizeof(float) * (size_t)sp->D);
            sp->job_of[m2++] = j;
            i2++;
        }
        m = m2;
    }
    for (int j = 0; j < nj; j++)
        ms_sched_set_draft(e->sched, j, sp->drafts + (int64_t)j * sp->steps, jobs[j].want);
    return 0;
}
