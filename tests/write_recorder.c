/* A test's recorder of what a process writes to one file, for building the images a machine
 * crash (power lost, the kernel panicking) could leave of it: loaded with LD_PRELOAD, it
 * appends to WRITE_RECORDER_LOG every write to WRITE_RECORDER_FILE (its offset and bytes)
 * and every flush of that file (fsync, fdatasync), in the order they happened across all
 * the processes that load it (an exclusive flock on the log around the call and its record).
 * tests/crash_images.py reads the log. Built by that module with the machine's C compiler.
 *
 * A record: one kind byte, then the offset and the length (little-endian int64 each), then
 * the length's bytes for a write:
 *   'W' a write the page cache holds until a flush (or the kernel's own writeback),
 *   'D' a write through a descriptor opened O_DSYNC / O_SYNC (on the disk when it returns),
 *   'S' a flush of the file: every write before it is on the disk (offset, length 0).
 * A write through the file's mapping (MDB_WRITEMAP) is not seen: record only stores that
 * write through descriptors. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

static ssize_t (*real_pwrite)(int, const void *, size_t, off_t);
static ssize_t (*real_write)(int, const void *, size_t);
static ssize_t (*real_pwritev)(int, const struct iovec *, int, off_t);
static ssize_t (*real_writev)(int, const struct iovec *, int);
static int (*real_fsync)(int);
static int (*real_fdatasync)(int);

static int log_fd = -1;
static char target[PATH_MAX];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

__attribute__((constructor)) static void start(void) {
	real_pwrite = dlsym(RTLD_NEXT, "pwrite");
	real_write = dlsym(RTLD_NEXT, "write");
	real_pwritev = dlsym(RTLD_NEXT, "pwritev");
	real_writev = dlsym(RTLD_NEXT, "writev");
	real_fsync = dlsym(RTLD_NEXT, "fsync");
	real_fdatasync = dlsym(RTLD_NEXT, "fdatasync");
	const char *log = getenv("WRITE_RECORDER_LOG"), *file = getenv("WRITE_RECORDER_FILE");
	if (log && file && realpath(file, target) == NULL) /* not created yet: taken as given */
		snprintf(target, sizeof target, "%s", file);
	if (log && file)
		log_fd = open(log, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
}

/* Whether fd is the recorded file (a descriptor's path, each time: descriptors are reused). */
static int recorded(int fd) {
	char link[64], path[PATH_MAX];
	if (log_fd < 0)
		return 0;
	snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
	ssize_t n = readlink(link, path, sizeof path - 1);
	if (n <= 0)
		return 0;
	path[n] = 0;
	return strcmp(path, target) == 0;
}

static void hold(void) {
	pthread_mutex_lock(&lock); /* the threads of this process: flock is per open file */
	flock(log_fd, LOCK_EX);    /* the other processes */
}

static void release(void) {
	flock(log_fd, LOCK_UN);
	pthread_mutex_unlock(&lock);
}

static void out(const void *data, size_t n) {
	const char *p = data;
	while (n > 0) {
		ssize_t w = real_write(log_fd, p, n);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			abort(); /* a log with a gap would build images no crash leaves */
		p += w, n -= (size_t)w;
	}
}

static void note(int fd, char kind, int64_t offset, const struct iovec *iov, int count, int64_t length) {
	int flags = fcntl(fd, F_GETFL);
	if (kind == 'W' && flags >= 0 && (flags & (O_DSYNC | O_SYNC)))
		kind = 'D';
	char head[17];
	head[0] = kind;
	memcpy(head + 1, &offset, 8);
	memcpy(head + 9, &length, 8);
	out(head, sizeof head);
	for (int i = 0; i < count && length > 0; i++) {
		size_t n = iov[i].iov_len < (size_t)length ? iov[i].iov_len : (size_t)length;
		out(iov[i].iov_base, n);
		length -= (int64_t)n;
	}
}

/* The write itself, as the caller asked for it. */
static ssize_t real_written(int fd, const struct iovec *iov, int count, off_t offset, int positioned) {
	if (positioned)
		return count == 1 ? real_pwrite(fd, iov[0].iov_base, iov[0].iov_len, offset) : real_pwritev(fd, iov, count, offset);
	return count == 1 ? real_write(fd, iov[0].iov_base, iov[0].iov_len) : real_writev(fd, iov, count);
}

static ssize_t written(int fd, const struct iovec *iov, int count, off_t offset, int positioned) {
	if (!recorded(fd))
		return real_written(fd, iov, count, offset, positioned);
	hold();
	off_t at = positioned ? offset : lseek(fd, 0, SEEK_CUR);
	ssize_t done = real_written(fd, iov, count, offset, positioned);
	if (done > 0)
		note(fd, 'W', at, iov, count, done);
	release();
	return done;
}

ssize_t pwrite(int fd, const void *buf, size_t n, off_t offset) {
	struct iovec one = {(void *)buf, n};
	return written(fd, &one, 1, offset, 1);
}

ssize_t pwrite64(int fd, const void *buf, size_t n, off_t offset) { return pwrite(fd, buf, n, offset); }

ssize_t write(int fd, const void *buf, size_t n) {
	struct iovec one = {(void *)buf, n};
	return written(fd, &one, 1, 0, 0);
}

ssize_t pwritev(int fd, const struct iovec *iov, int count, off_t offset) { return written(fd, iov, count, offset, 1); }

ssize_t pwritev64(int fd, const struct iovec *iov, int count, off_t offset) { return written(fd, iov, count, offset, 1); }

ssize_t writev(int fd, const struct iovec *iov, int count) { return written(fd, iov, count, 0, 0); }

static int flushed(int fd, int (*real)(int)) {
	if (!recorded(fd))
		return real(fd);
	hold();
	int rc = real(fd);
	if (rc == 0)
		note(fd, 'S', 0, NULL, 0, 0);
	release();
	return rc;
}

int fsync(int fd) { return flushed(fd, real_fsync); }

int fdatasync(int fd) { return flushed(fd, real_fdatasync); }
