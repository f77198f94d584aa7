/* unixloops: the per-packet kernel work of a userspace data plane, as two published loops.
 *
 * A TUN daemon pays, per packet, kernel entries and small copies (read(TUN), sendto(UDP),
 * recvfrom, write(TUN)). Published Raspberry Pi 4 figures for exactly that kind of work are
 * UnixBench's (byte-unixbench 5.1.3, BYTE's 1983 loops): this program runs the same loops so the
 * lab can compare this host with the board (lab/campaign/calibpacket.py, docs/cpu.md
 * "Per-packet work"). Written for the lab, not taken from UnixBench:
 *
 *   pipe     UnixBench "Pipe Throughput": one process writes 512 bytes into a pipe and reads
 *            them back (2 syscalls, 2 copies of 512 bytes per loop);
 *   syscall  UnixBench "System Call Overhead" ("mix"): close(dup(fd)), getpid, getuid,
 *            umask(022) (5 syscalls per loop, almost no work inside the kernel).
 *
 * Usage: unixloops pipe|syscall SECONDS. Prints one JSON line: the loop, loops done, elapsed
 * seconds and this process's CPU seconds (user + system, getrusage), so a rate per CPU second
 * and one per elapsed second (under a cgroup cap) can both be taken.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static volatile sig_atomic_t stop;

static void on_alarm(int sig) { (void)sig; stop = 1; }

static double now(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static double cpu_seconds(void) {
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	return ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + ru.ru_stime.tv_sec +
	       ru.ru_stime.tv_usec / 1e6;
}

static unsigned long pipe_loop(void) {
	char buf[512];
	int p[2];
	unsigned long n = 0;
	memset(buf, 'x', sizeof buf);
	if (pipe(p) != 0) {
		perror("pipe");
		exit(2);
	}
	while (!stop) {
		if (write(p[1], buf, sizeof buf) != (ssize_t)sizeof buf && errno != EINTR) {
			perror("write");
			exit(2);
		}
		if (read(p[0], buf, sizeof buf) != (ssize_t)sizeof buf && errno != EINTR) {
			perror("read");
			exit(2);
		}
		n++;
	}
	return n;
}

static unsigned long syscall_loop(void) {
	int p[2];
	unsigned long n = 0;
	if (pipe(p) != 0 || close(p[1]) != 0) {
		perror("pipe");
		exit(2);
	}
	while (!stop) {
		close(dup(p[0]));
		syscall(SYS_getpid); /* not glibc's getpid(): never served from a cache */
		getuid();
		umask(022);
		n++;
	}
	return n;
}

int main(int argc, char **argv) {
	if (argc != 3 || (strcmp(argv[1], "pipe") != 0 && strcmp(argv[1], "syscall") != 0)) {
		fprintf(stderr, "usage: %s pipe|syscall SECONDS\n", argv[0]);
		return 1;
	}
	int seconds = atoi(argv[2]);
	if (seconds < 1) {
		fprintf(stderr, "SECONDS must be a whole number >= 1\n");
		return 1;
	}
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_alarm; /* no SA_RESTART: a blocked call returns EINTR and the loop ends */
	sigaction(SIGALRM, &sa, NULL);
	double c0 = cpu_seconds(), t0 = now();
	alarm(seconds);
	unsigned long n = strcmp(argv[1], "pipe") == 0 ? pipe_loop() : syscall_loop();
	double elapsed = now() - t0, cpu = cpu_seconds() - c0;
	printf("{\"loop\": \"%s\", \"loops\": %lu, \"elapsed_s\": %.6f, \"cpu_s\": %.6f}\n", argv[1],
	       n, elapsed, cpu);
	return 0;
}
