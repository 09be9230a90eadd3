/* The floor of a 1.2 MB request over one loopback TCP connection (notes/036,
 * docs/bench.md): what any TCP key-value store whose sender copies, kvtier or
 * Redis, must at least spend to move one block that is in the cache and a
 * reply, with nothing else done (a sender that splices spends less:
 * write-splice, notes/037; on cold memory, BUFFERS below, a store can beat
 * the copying floor: notes/039).
 *
 *   tcp-floor serve PORT SIZE [BUFFERS]
 *   tcp-floor client PORT SIZE read|write|write-splice|read-splice SECONDS
 *
 * The client sends a 1-byte opcode ('R', 'W', or 'P' for read-splice). A
 * write sends SIZE bytes after it and waits for a 1-byte acknowledgement; a
 * read waits for SIZE bytes. Each side reuses buffers allocated and touched
 * up front (one, unless the server is given BUFFERS): no
 * framing, no allocation, no page faults, no checksum, no store, one copy on
 * each side (the kernel's), the sockets at the system's defaults. The client
 * prints "<ops> <seconds>". The server serves one connection at a time, in
 * one thread, until killed.
 *
 * write-splice sends the block without the kernel's copy on the client:
 * vmsplice(2) maps the buffer's pages into a pipe (made 1 MiB) and splice(2)
 * moves them into the socket, so the server's read is the only copy
 * (notes/037). The buffer is never changed, so the pages may be referenced
 * by the socket for as long as it likes. read-splice is the same on the
 * server's side: the reply is spliced, and the client's read is the only
 * copy (notes/039).
 *
 * BUFFERS (default 1): the server takes one of its buffers per request, at
 * random (uniformly, as kvtier bench picks one of its 64 preloaded blocks),
 * so with 64 of them it touches 64 × SIZE bytes as a store reading 64
 * blocks does, more than the cache holds (notes/039).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

static void die(const char *what) {
    perror(what);
    exit(1);
}

/* 1 when n bytes were read, 0 when the peer closed first. */
static int read_full(int fd, char *buf, size_t n) {
    while (n > 0) {
        ssize_t got = read(fd, buf, n);
        if (got == 0) return 0;
        if (got < 0) die("read");
        buf += got;
        n -= (size_t)got;
    }
    return 1;
}

static void write_full(int fd, const char *buf, size_t n) {
    while (n > 0) {
        ssize_t put = write(fd, buf, n);
        if (put <= 0) die("write");
        buf += put;
        n -= (size_t)put;
    }
}

/* The block through a pipe: vmsplice its pages, splice them to the socket. */
static void splice_full(int fd, int pipe_rd, int pipe_wr, const char *buf, size_t n) {
    while (n > 0) {
        struct iovec v = {(void *)buf, n};
        ssize_t in = vmsplice(pipe_wr, &v, 1, 0);
        if (in <= 0) die("vmsplice");
        for (ssize_t left = in; left > 0;) {
            /* More of the block follows this pipeful: do not push yet. */
            ssize_t out = splice(pipe_rd, NULL, fd, NULL, (size_t)left, (size_t)in < n ? SPLICE_F_MORE : 0);
            if (out <= 0) die("splice");
            left -= out;
        }
        buf += in;
        n -= (size_t)in;
    }
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

/* splitmix64, as kvtier bench's `mix`. */
static unsigned long long mix(unsigned long long x) {
    x += 0x9E3779B97F4A7C15ULL;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}

static void serve(int port, size_t size, char **bufs, int nbufs) {
    unsigned long long turn = 0;
    int p[2] = {-1, -1};
    int one = 1, ls = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(ls, (struct sockaddr *)&a, sizeof a) || listen(ls, 4)) die("listen");
    for (;;) {
        int c = accept(ls, NULL, NULL);
        if (c < 0) die("accept");
        setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        char op;
        while (read_full(c, &op, 1)) {
            char *buf = bufs[mix(turn++) % (unsigned long long)nbufs];
            if (op == 'W') {
                if (!read_full(c, buf, size)) break;
                write_full(c, "k", 1);
            } else if (op == 'P') {
                if (p[0] < 0 && (pipe(p) || fcntl(p[1], F_SETPIPE_SZ, 1 << 20) < 0)) die("pipe");
                splice_full(c, p[0], p[1], buf, size);
            } else {
                write_full(c, buf, size);
            }
        }
        close(c);
        /* A connection that ended mid-reply may leave bytes in the pipe. */
        if (p[0] >= 0) {
            close(p[0]);
            close(p[1]);
            p[0] = p[1] = -1;
        }
    }
}

static void client(int port, size_t size, char *buf, char op, double seconds) {
    int p[2] = {-1, -1};
    if (op == 'S') {
        if (pipe(p) || fcntl(p[1], F_SETPIPE_SZ, 1 << 20) < 0) die("pipe");
    }
    int one = 1, c = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(c, (struct sockaddr *)&a, sizeof a)) die("connect");
    setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    long ops = 0;
    double t0 = now(), t;
    char ack;
    do {
        if (op == 'W' || op == 'S') {
            write_full(c, "W", 1);
            if (op == 'S') splice_full(c, p[0], p[1], buf, size);
            else write_full(c, buf, size);
            if (!read_full(c, &ack, 1)) die("server closed");
        } else {
            write_full(c, op == 'P' ? "P" : "R", 1);
            if (!read_full(c, buf, size)) die("server closed");
        }
        ops++;
        t = now();
    } while (t - t0 < seconds);
    printf("%ld %.6f\n", ops, t - t0);
}

static int usage(void) {
    fprintf(stderr, "usage: tcp-floor serve PORT SIZE [BUFFERS] | client PORT SIZE read|write|write-splice|read-splice SECONDS\n");
    return 2;
}

/* The client's opcode for a mode name; 0 for an unknown one. */
static char opcode(const char *mode) {
    static const struct { const char *name; char op; } modes[] = {
        {"read", 'R'}, {"write", 'W'}, {"write-splice", 'S'}, {"read-splice", 'P'}};
    for (size_t i = 0; i < sizeof modes / sizeof *modes; i++)
        if (!strcmp(mode, modes[i].name)) return modes[i].op;
    return 0;
}

int main(int argc, char **argv) {
    int serving = argc >= 4 && !strcmp(argv[1], "serve");
    char op = argc == 6 && !strcmp(argv[1], "client") ? opcode(argv[4]) : 0;
    if ((!serving || argc > 5) && !op) return usage();
    int port = atoi(argv[2]);
    size_t size = strtoul(argv[3], NULL, 10);
    int nbufs = serving && argc == 5 ? atoi(argv[4]) : 1;
    if (nbufs < 1 || size == 0) return usage();
    char **bufs = malloc(sizeof *bufs * (size_t)nbufs);
    if (!bufs) die("malloc");
    for (int i = 0; i < nbufs; i++) {
        if (!(bufs[i] = malloc(size))) die("malloc");
        memset(bufs[i], 'x', size);
    }
    if (serving) serve(port, size, bufs, nbufs);
    else client(port, size, bufs[0], op, atof(argv[5]));
    return 0;
}
