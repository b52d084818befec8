/* http_client.h — a tiny blocking HTTP/1.1 client for the serve tests: raw
 * sockets, Connection: close, chunked decoding, a deadline on every call.
 * Header-only; test code only. */
#ifndef MS_TESTS_HTTP_CLIENT_H
#define MS_TESTS_HTTP_CLIENT_H

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

typedef struct hresp {
    int status;
    char head[8192];
    char *body; /* decoded, NUL-terminated */
    size_t n;
} hresp;

static void hresp_free(hresp *r)
{
    free(r->body);
    memset(r, 0, sizeof *r);
}

static int hc_connect(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a)) {
        if (fd >= 0) close(fd);
        return -1;
    }
    return fd;
}

static int hc_send_all(int fd, const char *s, size_t n)
{
    while (n) {
        ssize_t w = send(fd, s, n, MSG_NOSIGNAL);
        if (w <= 0) return -1;
        s += w;
        n -= (size_t)w;
    }
    return 0;
}

static double hc_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Reads everything until EOF (or the deadline); returns bytes or -1. */
static long hc_read_all(int fd, char **out, double timeout_s)
{
    size_t cap = 65536, n = 0;
    char *b = malloc(cap);
    double end = hc_now() + timeout_s;
    for (;;) {
        int left = (int)((end - hc_now()) * 1000);
        if (left <= 0) break;
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, left) <= 0) break;
        if (n + 4096 > cap) b = realloc(b, cap *= 2);
        ssize_t r = recv(fd, b + n, cap - n - 1, 0);
        if (r <= 0) {
            b[n] = 0;
            *out = b;
            return (long)n;
        }
        n += (size_t)r;
    }
    b[n] = 0;
    *out = b;
    return -1; /* timed out */
}

static int hc_parse(const char *raw, size_t n, hresp *r)
{
    memset(r, 0, sizeof *r);
    if (sscanf(raw, "HTTP/1.%*d %d", &r->status) != 1) return -1;
    const char *sep = strstr(raw, "\r\n\r\n");
    if (!sep) return -1;
    size_t hl = (size_t)(sep - raw);
    snprintf(r->head, sizeof r->head, "%.*s",
             (int)(hl < sizeof r->head - 1 ? hl : sizeof r->head - 1), raw);
    const char *p = sep + 4, *end = raw + n;
    r->body = malloc((size_t)(end - p) + 1);
    if (strcasestr(r->head, "Transfer-Encoding: chunked")) {
        while (p < end) {
            char *e2;
            unsigned long k = strtoul(p, &e2, 16);
            const char *nl = strstr(p, "\r\n");
            if (!nl || e2 == p) break;
            p = nl + 2;
            if (k == 0) break;
            if (p + k > end) k = (unsigned long)(end - p);
            memcpy(r->body + r->n, p, k);
            r->n += k;
            p += k + 2;
        }
    } else {
        memcpy(r->body, p, (size_t)(end - p));
        r->n = (size_t)(end - p);
    }
    r->body[r->n] = 0;
    return 0;
}

/* One request with Connection: close.  extra: additional header lines ("K: V\r\n"). */
static int hc_request(int port, const char *method, const char *path, const char *body,
                      const char *extra, hresp *r)
{
    memset(r, 0, sizeof *r);
    int fd = hc_connect(port);
    if (fd < 0) return -1;
    size_t bl = body ? strlen(body) : 0;
    char *req = malloc(bl + 1024 + (extra ? strlen(extra) : 0));
    int hl = sprintf(req,
                     "%s %s HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n%s"
                     "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
                     method, path, extra ? extra : "", bl);
    if (bl) memcpy(req + hl, body, bl);
    int rc = hc_send_all(fd, req, (size_t)hl + bl);
    free(req);
    char *raw = NULL;
    long n = rc ? -1 : hc_read_all(fd, &raw, 20);
    close(fd);
    if (n < 0) {
        free(raw);
        return -1;
    }
    rc = hc_parse(raw, (size_t)n, r);
    free(raw);
    return rc;
}

#endif
