/* options.c — the front end's command-line flags (http.h): defaults, parsing
 * with range checks, help text.  Main thread, start-up only. */
#include "serve/http.h"

#include "serve/chat.h"
#include "serve/openai.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

void ms_frontend_opts_init(ms_frontend_opts *o)
{
    memset(o, 0, sizeof *o);
    snprintf(o->host, sizeof o->host, "127.0.0.1");
    o->port = 30000;
    o->watchdog_timeout_s = 300;
    o->max_body_bytes = 32u << 20;
    o->max_connections = 256;
    o->idle_timeout_s = 10;
    o->body_timeout_s = 30;
    o->header_timeout_s = 30;
    o->health_timeout_s = 20;
    o->stream_interval = 1;
    o->decode_log_interval = 40; /* SGLang's default */
}

static int num(const char *flag, const char *v, double lo, double hi, double *out, ms_errbuf *e)
{
    char *end;
    errno = 0;
    double d = strtod(v, &end);
    if (errno || end == v || *end || !(d >= lo && d <= hi))
        return ms_err(e, MS_EINVAL, "%s: expected a number in [%g, %g], got '%s'", flag, lo, hi, v);
    *out = d;
    return 0;
}

static int integer(const char *flag, const char *v, double lo, double hi, int *out, ms_errbuf *e)
{
    double d;
    int rc = num(flag, v, lo, hi, &d, e);
    if (rc) return rc;
    if (d != (int)d) return ms_err(e, MS_EINVAL, "%s: expected an integer, got '%s'", flag, v);
    *out = (int)d;
    return 0;
}

static int str(const char *flag, const char *v, char *dst, size_t cap, ms_errbuf *e)
{
    if (strlen(v) >= cap)
        return ms_err(e, MS_EINVAL, "%s: value longer than %zu bytes", flag, cap - 1);
    memcpy(dst, v, strlen(v) + 1);
    return 0;
}

int ms_frontend_parse_flag(ms_frontend_opts *o, int argc, char **argv, int i, ms_errbuf *e)
{
    static const char *flags[] = {"--host",
                                  "--port",
                                  "--api-key",
                                  "--served-model-name",
                                  "--max-queued-requests",
                                  "--reasoning-parser",
                                  "--tool-call-parser",
                                  "--enable-metrics",
                                  "--watchdog-timeout",
                                  "--max-body-bytes",
                                  "--max-connections",
                                  "--http-idle-timeout",
                                  "--http-body-timeout",
                                  "--health-timeout",
                                  "--http-header-timeout",
                                  "--stream-interval",
                                  "--enable-cache-report",
                                  "--max-connections-per-client",
                                  "--decode-log-interval"};
    const char *a = argv[i], *val = NULL;
    char name[64];
    const char *eq = strchr(a, '=');
    size_t nl = eq ? (size_t)(eq - a) : strlen(a);
    if (nl >= sizeof name) return 0;
    memcpy(name, a, nl);
    name[nl] = 0;
    int k = -1;
    for (int j = 0; j < (int)(sizeof flags / sizeof flags[0]); j++)
        if (!strcmp(name, flags[j])) k = j;
    if (k < 0) return 0;
    int used = 1;
    if (k == 7 || k == 16) { /* switches */
        if (eq) return ms_err(e, MS_EINVAL, "%s takes no value", name);
        if (k == 7) o->enable_metrics = 1;
        /* --enable-cache-report: usage always carries prompt_tokens_details.cached_tokens */
        return 1;
    }
    if (eq)
        val = eq + 1;
    else if (i + 1 < argc) {
        val = argv[i + 1];
        used = 2;
    } else
        return ms_err(e, MS_EINVAL, "%s needs a value", name);
    double d;
    int rc = 0;
    switch (k) {
    case 0:
        rc = str(name, val, o->host, sizeof o->host, e);
        break;
    case 1:
        if (!(rc = num(name, val, 0, 65535, &d, e))) o->port = (int)d;
        break;
    case 2:
        rc = str(name, val, o->api_key, sizeof o->api_key, e);
        break;
    case 3:
        rc = str(name, val, o->served_model_name, sizeof o->served_model_name, e);
        break;
    case 4:
        if (!(rc = num(name, val, 0, 1e9, &d, e))) o->max_queued_requests = (int32_t)d;
        break;
    case 5:
        if (!strcmp(val, "deepseek-r1"))
            o->reasoning_parser = MS_REASONING_DEEPSEEK_R1;
        else if (!strcmp(val, "deepseek-v3"))
            o->reasoning_parser = MS_REASONING_DEEPSEEK_V3;
        else if (!strcmp(val, "deepseek-v4"))
            o->reasoning_parser = MS_REASONING_DEEPSEEK_V4;
        else if (!strcmp(val, "none"))
            o->reasoning_parser = MS_REASONING_OFF;
        else
            rc = ms_err(e, MS_EINVAL,
                        "%s: expected deepseek-r1, deepseek-v3, deepseek-v4 or none, got '%s'",
                        name, val);
        break;
    case 6:
        if (!strcmp(val, "deepseekv31") || !strcmp(val, "deepseekv3.1"))
            o->tool_call_parser = MS_TOOL_PARSER_DEEPSEEK_V31;
        else if (!strcmp(val, "deepseekv4"))
            o->tool_call_parser = MS_TOOL_PARSER_DEEPSEEK_V4;
        else if (!strcmp(val, "none"))
            o->tool_call_parser = MS_TOOL_PARSER_NONE;
        else
            rc = ms_err(e, MS_EINVAL, "%s: expected deepseekv31, deepseekv4 or none, got '%s'",
                        name, val);
        break;
    case 8:
        if (!(rc = num(name, val, 0, 1e6, &d, e))) o->watchdog_timeout_s = d;
        break;
    case 9:
        if (!(rc = num(name, val, 1024, 1e10, &d, e))) o->max_body_bytes = (size_t)d;
        break;
    case 10:
        if (!(rc = num(name, val, 1, 65536, &d, e))) o->max_connections = (int)d;
        break;
    case 11:
        if (!(rc = num(name, val, 1, 3600, &d, e))) o->idle_timeout_s = (int)d;
        break;
    case 12:
        if (!(rc = num(name, val, 1, 3600, &d, e))) o->body_timeout_s = (int)d;
        break;
    case 13:
        if (!(rc = num(name, val, 1, 3600, &d, e))) o->health_timeout_s = (int)d;
        break;
    case 14:
        if (!(rc = num(name, val, 1, 3600, &d, e))) o->header_timeout_s = (int)d;
        break;
    case 15:
        rc = integer(name, val, 1, 1e6, &o->stream_interval, e);
        break;
    case 17:
        if (!(rc = num(name, val, 0, 65536, &d, e))) o->max_connections_per_client = (int)d;
        break;
    case 18:
        rc = integer(name, val, 1, 1e9, &o->decode_log_interval, e);
        break;
    default:
        break;
    }
    return rc ? rc : used;
}

void ms_frontend_print_flags(FILE *f)
{
    fprintf(
        f,
        "HTTP front end:\n"
        "  --host ADDR                listen address (default 127.0.0.1)\n"
        "  --port N                   port (default 30000; 0 = any free port)\n"
        "  --api-key KEY              require 'Authorization: Bearer KEY'\n"
        "  --served-model-name NAME   model id in /v1/models and responses\n"
        "  --max-queued-requests N    503 when N requests wait (default unlimited)\n"
        "  --reasoning-parser P       deepseek-r1 | deepseek-v3 | deepseek-v4: reasoning_content\n"
        "  --tool-call-parser P       deepseekv31 | deepseekv4 (DSML; also selects V4's chat\n"
        "                             format, as SGLang's does): tool calls into tool_calls\n"
        "  --enable-metrics           serve Prometheus metrics at /metrics\n"
        "  --watchdog-timeout S       exit when no engine step for S s while busy (300; 0 off)\n"
        "  --max-body-bytes N         request body limit, 413 above (32 MiB)\n"
        "  --max-connections N        concurrent connections (256)\n"
        "  --max-connections-per-client N  per client address; more are closed (0: no cap)\n"
        "  --http-idle-timeout S      close idle connections after S s (10)\n"
        "  --http-body-timeout S      a request body must arrive within S s of its\n"
        "                             headers, else the connection is closed (30)\n"
        "  --http-header-timeout S    request headers must arrive within S s (30)\n"
        "  --health-timeout S         /health_generate deadline (20)\n"
        "  --stream-interval N        SSE: the first token, then one chunk per N tokens (1)\n"
        "  --decode-log-interval N    the decode log line (accept len/rate) every N steps (40)\n"
        "  --enable-cache-report      accepted: usage always reports\n"
        "                             prompt_tokens_details.cached_tokens\n");
}
