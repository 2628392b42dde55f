/* Timed inner loops of the xbench probe patterns, kept out of Python.
 *
 * Built at run time with the MPI's own mpicc (see xbench/fabric/cloop.py) and called
 * through ctypes; the GIL is released during each call. MPI loops take a pointer to the
 * MPI_Comm handle (mpi4py's MPI._addressof(comm)), so the same source works whether
 * MPI_Comm is an int (MPICH ABI) or a pointer (Open MPI). TCP loops take a connected
 * socket descriptor. Every function returns the elapsed seconds of `iters` repetitions on
 * the calling rank (MPI_Wtime for MPI, CLOCK_MONOTONIC for TCP), or a negative number on
 * error. Message patterns follow OSU's osu_latency / osu_bw / osu_bibw.
 */
#include <mpi.h>
#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define TAG_DATA 11
#define TAG_ACK 12

/* initiator: send `send_n`, receive `recv_n`; responder: the mirror image. */
double xb_mpi_exchange(MPI_Comm *comm, int peer, int initiator, char *sbuf, long send_n,
                       char *rbuf, long recv_n, long iters) {
    MPI_Comm c = *comm;
    double t0 = MPI_Wtime();
    for (long i = 0; i < iters; i++) {
        if (initiator) {
            MPI_Send(sbuf, (int)send_n, MPI_CHAR, peer, TAG_DATA, c);
            MPI_Recv(rbuf, (int)recv_n, MPI_CHAR, peer, TAG_DATA, c, MPI_STATUS_IGNORE);
        } else {
            MPI_Recv(rbuf, (int)send_n, MPI_CHAR, peer, TAG_DATA, c, MPI_STATUS_IGNORE);
            MPI_Send(sbuf, (int)recv_n, MPI_CHAR, peer, TAG_DATA, c);
        }
    }
    return MPI_Wtime() - t0;
}

/* Uni-directional stream: `window` messages in flight, then a 4-byte acknowledgement. */
double xb_mpi_window(MPI_Comm *comm, int peer, int sender, char *buf, long n, int window,
                     long iters, MPI_Request *reqs) {
    MPI_Comm c = *comm;
    char ack[4] = {0};
    double t0 = MPI_Wtime();
    for (long i = 0; i < iters; i++) {
        if (sender) {
            for (int w = 0; w < window; w++)
                MPI_Isend(buf, (int)n, MPI_CHAR, peer, TAG_DATA, c, &reqs[w]);
            MPI_Waitall(window, reqs, MPI_STATUSES_IGNORE);
            MPI_Recv(ack, 4, MPI_CHAR, peer, TAG_ACK, c, MPI_STATUS_IGNORE);
        } else {
            for (int w = 0; w < window; w++)
                MPI_Irecv(buf, (int)n, MPI_CHAR, peer, TAG_DATA, c, &reqs[w]);
            MPI_Waitall(window, reqs, MPI_STATUSES_IGNORE);
            MPI_Send(ack, 4, MPI_CHAR, peer, TAG_ACK, c);
        }
    }
    return MPI_Wtime() - t0;
}

/* Bi-directional stream: both ranks post `window` receives and sends at once. */
double xb_mpi_biwindow(MPI_Comm *comm, int peer, char *sbuf, char *rbuf, long n, int window,
                       long iters, MPI_Request *reqs) {
    MPI_Comm c = *comm;
    double t0 = MPI_Wtime();
    for (long i = 0; i < iters; i++) {
        for (int w = 0; w < window; w++)
            MPI_Irecv(rbuf, (int)n, MPI_CHAR, peer, TAG_DATA, c, &reqs[w]);
        for (int w = 0; w < window; w++)
            MPI_Isend(sbuf, (int)n, MPI_CHAR, peer, TAG_DATA, c, &reqs[window + w]);
        MPI_Waitall(2 * window, reqs, MPI_STATUSES_IGNORE);
    }
    return MPI_Wtime() - t0;
}

/* Fetch k blocks of `block` bytes scattered at `offsets` of `cache`.
 * mode 0: one message per block; 1: holder packs into `staging`, one message, requester
 * unpacks; 2: one contiguous message of the same bytes (no pack, no unpack).
 * The requester sends a 1-byte request first, so the time is the full fetch round. */
double xb_mpi_fetch(MPI_Comm *comm, int peer, int requester, int mode, char *cache,
                    const long *offsets, int k, long block, char *staging, long iters,
                    MPI_Request *reqs) {
    MPI_Comm c = *comm;
    char req = 1;
    double t0 = MPI_Wtime();
    for (long i = 0; i < iters; i++) {
        if (requester) {
            MPI_Send(&req, 1, MPI_CHAR, peer, TAG_ACK, c);
            if (mode == 0) {
                for (int j = 0; j < k; j++)
                    MPI_Irecv(cache + offsets[j], (int)block, MPI_CHAR, peer, TAG_DATA, c, &reqs[j]);
                MPI_Waitall(k, reqs, MPI_STATUSES_IGNORE);
            } else if (mode == 1) {
                MPI_Recv(staging, (int)(block * k), MPI_CHAR, peer, TAG_DATA, c, MPI_STATUS_IGNORE);
                for (int j = 0; j < k; j++) memcpy(cache + offsets[j], staging + (long)j * block, block);
            } else {
                MPI_Recv(staging, (int)(block * k), MPI_CHAR, peer, TAG_DATA, c, MPI_STATUS_IGNORE);
            }
        } else {
            MPI_Recv(&req, 1, MPI_CHAR, peer, TAG_ACK, c, MPI_STATUS_IGNORE);
            if (mode == 0) {
                for (int j = 0; j < k; j++)
                    MPI_Isend(cache + offsets[j], (int)block, MPI_CHAR, peer, TAG_DATA, c, &reqs[j]);
                MPI_Waitall(k, reqs, MPI_STATUSES_IGNORE);
            } else if (mode == 1) {
                for (int j = 0; j < k; j++) memcpy(staging + (long)j * block, cache + offsets[j], block);
                MPI_Send(staging, (int)(block * k), MPI_CHAR, peer, TAG_DATA, c);
            } else {
                MPI_Send(staging, (int)(block * k), MPI_CHAR, peer, TAG_DATA, c);
            }
        }
    }
    return MPI_Wtime() - t0;
}

/* ---- TCP: blocking sockets, TCP_NODELAY set by the caller ---- */

static double mono(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int send_all(int fd, const char *p, long n) {
    while (n > 0) {
        ssize_t w = send(fd, p, (size_t)n, MSG_NOSIGNAL);
        if (w < 0) { if (errno == EINTR) continue; return -1; }
        if (w == 0) return -1;
        p += w; n -= w;
    }
    return 0;
}

static int recv_all(int fd, char *p, long n) {
    while (n > 0) {
        ssize_t r = recv(fd, p, (size_t)n, 0);
        if (r < 0) { if (errno == EINTR) continue; return -1; }
        if (r == 0) return -1; /* peer closed */
        p += r; n -= r;
    }
    return 0;
}

double xb_tcp_exchange(int fd, int initiator, char *sbuf, long send_n, char *rbuf, long recv_n,
                       long iters) {
    double t0 = mono();
    for (long i = 0; i < iters; i++) {
        if (initiator) {
            if (send_all(fd, sbuf, send_n) || recv_all(fd, rbuf, recv_n)) return -1.0;
        } else {
            if (recv_all(fd, rbuf, send_n) || send_all(fd, sbuf, recv_n)) return -1.0;
        }
    }
    return mono() - t0;
}

double xb_tcp_window(int fd, int sender, char *buf, long n, int window, long iters) {
    char ack = 0;
    double t0 = mono();
    for (long i = 0; i < iters; i++) {
        if (sender) {
            for (int w = 0; w < window; w++) if (send_all(fd, buf, n)) return -1.0;
            if (recv_all(fd, &ack, 1)) return -1.0;
        } else {
            for (int w = 0; w < window; w++) if (recv_all(fd, buf, n)) return -1.0;
            if (send_all(fd, &ack, 1)) return -1.0;
        }
    }
    return mono() - t0;
}

/* Both directions at once on one socket: poll until `total` bytes went each way. */
double xb_tcp_duplex(int fd, char *sbuf, char *rbuf, long n, int window, long iters) {
    double t0 = mono();
    for (long i = 0; i < iters; i++) {
        long total = n * window, sent = 0, got = 0;
        while (sent < total || got < total) {
            struct pollfd p = {fd, 0, 0};
            if (sent < total) p.events |= POLLOUT;
            if (got < total) p.events |= POLLIN;
            if (poll(&p, 1, -1) < 0) { if (errno == EINTR) continue; return -1.0; }
            if (p.revents & (POLLERR | POLLHUP | POLLNVAL)) return -1.0;
            if ((p.revents & POLLOUT) && sent < total) {
                long at = sent % n; /* position inside the current message */
                ssize_t w = send(fd, sbuf + at, (size_t)(n - at), MSG_NOSIGNAL | MSG_DONTWAIT);
                if (w > 0) sent += w; else if (w < 0 && errno != EAGAIN && errno != EINTR) return -1.0;
            }
            if ((p.revents & POLLIN) && got < total) {
                long at = got % n;
                ssize_t r = recv(fd, rbuf + at, (size_t)(n - at), MSG_DONTWAIT);
                if (r > 0) got += r; else if (r == 0) return -1.0;
                else if (errno != EAGAIN && errno != EINTR) return -1.0;
            }
        }
    }
    return mono() - t0;
}

double xb_tcp_fetch(int fd, int requester, int mode, char *cache, const long *offsets, int k,
                    long block, char *staging, long iters) {
    char req = 1;
    double t0 = mono();
    for (long i = 0; i < iters; i++) {
        if (requester) {
            if (send_all(fd, &req, 1)) return -1.0;
            if (mode == 0) {
                for (int j = 0; j < k; j++) if (recv_all(fd, cache + offsets[j], block)) return -1.0;
            } else {
                if (recv_all(fd, staging, block * k)) return -1.0;
                if (mode == 1) for (int j = 0; j < k; j++) memcpy(cache + offsets[j], staging + (long)j * block, block);
            }
        } else {
            if (recv_all(fd, &req, 1)) return -1.0;
            if (mode == 0) {
                for (int j = 0; j < k; j++) if (send_all(fd, cache + offsets[j], block)) return -1.0;
            } else {
                if (mode == 1) for (int j = 0; j < k; j++) memcpy(staging + (long)j * block, cache + offsets[j], block);
                if (send_all(fd, staging, block * k)) return -1.0;
            }
        }
    }
    return mono() - t0;
}

/* The loop's own cost: a call that times nothing, for the overhead rows. */
double xb_empty(long iters) {
    volatile long sink = 0;
    double t0 = mono();
    for (long i = 0; i < iters; i++) sink += i;
    return mono() - t0;
}
