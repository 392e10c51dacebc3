/*
 * The kernel's best case without a runtime: one thread per CPU, each with its own epoll set and
 * SO_REUSEPORT listeners, level-triggered, non-blocking sockets, no allocation per request.
 * Serves the comparison program's three ports: echo (what is read is written back), sink (read
 * and dropped) and source (64 KiB writes for as long as the peer reads).
 *
 *   epoll_server ECHO_PORT SINK_PORT SOURCE_PORT CPU [CPU...]
 *
 * Prints "ready" once every thread listens; runs until killed.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#define CHUNK (64 * 1024)
#define MAX_EVENTS 256

enum role { ECHO, SINK, SOURCE };

/* One connection: its role, and for echo what is still to be written back. */
struct conn {
    int fd;
    enum role role;
    size_t off, len;
    char *pending;
};

struct worker {
    int cpu;
    unsigned short ports[3];
    pthread_barrier_t *ready;
};

static char source_buf[CHUNK];

static void die(const char *what) {
    perror(what);
    exit(1);
}

static int listener(unsigned short port) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    if (fd < 0) die("socket");
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one) < 0) die("SO_REUSEPORT");
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    if (bind(fd, (struct sockaddr *)&a, sizeof a) < 0) die("bind");
    if (listen(fd, 1024) < 0) die("listen");
    return fd;
}

static void drop(int ep, struct conn *c) {
    epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    free(c->pending);
    free(c);
}

/* Writes what echo still owes; returns -1 when the connection is gone. */
static int flush(int ep, struct conn *c) {
    while (c->off < c->len) {
        ssize_t n = write(c->fd, c->pending + c->off, c->len - c->off);
        if (n < 0) {
            if (errno == EAGAIN) {
                struct epoll_event ev = {.events = EPOLLOUT, .data.ptr = c};
                epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev);
                return 0;
            }
            return -1;
        }
        c->off += (size_t)n;
    }
    c->off = c->len = 0;
    return 1;
}

static void on_event(int ep, struct conn *c, unsigned events, char *buf) {
    if (c->role == SOURCE) {
        if (write(c->fd, source_buf, CHUNK) < 0 && errno != EAGAIN) drop(ep, c);
        return;
    }
    if (c->len > 0) {
        /* Echo waiting for room: write the rest, then read again. */
        int r = flush(ep, c);
        if (r < 0) {
            drop(ep, c);
        } else if (r > 0) {
            struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
            epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev);
        }
        return;
    }
    (void)events;
    ssize_t n = read(c->fd, buf, CHUNK);
    if (n == 0 || (n < 0 && errno != EAGAIN)) {
        drop(ep, c);
        return;
    }
    if (n < 0 || c->role == SINK) return;
    ssize_t w = write(c->fd, buf, (size_t)n);
    if (w == n) return;
    if (w < 0 && errno != EAGAIN) {
        drop(ep, c);
        return;
    }
    if (w < 0) w = 0;
    c->pending = c->pending ? c->pending : malloc(CHUNK);
    if (!c->pending) die("malloc");
    memcpy(c->pending, buf + w, (size_t)(n - w));
    c->off = 0;
    c->len = (size_t)(n - w);
    if (flush(ep, c) < 0) drop(ep, c);
}

static void *serve(void *arg) {
    struct worker *w = arg;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(w->cpu, &set);
    if (pthread_setaffinity_np(pthread_self(), sizeof set, &set) != 0) die("affinity");
    int ep = epoll_create1(0);
    if (ep < 0) die("epoll_create1");
    int lfd[3];
    for (int i = 0; i < 3; i++) {
        lfd[i] = listener(w->ports[i]);
        /* Listeners are told apart from connections by a small tagged pointer value. */
        struct epoll_event ev = {.events = EPOLLIN, .data.u64 = (uint64_t)(i + 1)};
        if (epoll_ctl(ep, EPOLL_CTL_ADD, lfd[i], &ev) < 0) die("epoll_ctl");
    }
    pthread_barrier_wait(w->ready);
    char *buf = malloc(CHUNK);
    if (!buf) die("malloc");
    struct epoll_event evs[MAX_EVENTS];
    for (;;) {
        int n = epoll_wait(ep, evs, MAX_EVENTS, -1);
        if (n < 0) {
            if (errno == EINTR) continue;
            die("epoll_wait");
        }
        for (int k = 0; k < n; k++) {
            uint64_t tag = evs[k].data.u64;
            if (tag >= 1 && tag <= 3) {
                int fd;
                while ((fd = accept4(lfd[tag - 1], NULL, NULL, SOCK_NONBLOCK)) >= 0) {
                    int one = 1;
                    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                    struct conn *c = calloc(1, sizeof *c);
                    if (!c) die("calloc");
                    c->fd = fd;
                    c->role = (enum role)(tag - 1);
                    struct epoll_event ev = {
                        .events = c->role == SOURCE ? EPOLLOUT : EPOLLIN, .data.ptr = c};
                    if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) < 0) die("epoll_ctl");
                }
                continue;
            }
            on_event(ep, evs[k].data.ptr, evs[k].events, buf);
        }
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: %s ECHO_PORT SINK_PORT SOURCE_PORT CPU [CPU...]\n", argv[0]);
        return 2;
    }
    memset(source_buf, 0xa5, sizeof source_buf);
    int nw = argc - 4;
    pthread_barrier_t ready;
    pthread_barrier_init(&ready, NULL, (unsigned)nw + 1);
    struct worker *ws = calloc((size_t)nw, sizeof *ws);
    pthread_t *ts = calloc((size_t)nw, sizeof *ts);
    if (!ws || !ts) die("calloc");
    for (int i = 0; i < nw; i++) {
        ws[i].cpu = atoi(argv[4 + i]);
        for (int p = 0; p < 3; p++) ws[i].ports[p] = (unsigned short)atoi(argv[1 + p]);
        ws[i].ready = &ready;
        if (pthread_create(&ts[i], NULL, serve, &ws[i]) != 0) die("pthread_create");
    }
    pthread_barrier_wait(&ready);
    printf("ready\n");
    fflush(stdout);
    for (int i = 0; i < nw; i++) pthread_join(ts[i], NULL);
    return 0;
}
