/* fsops — tiny metadata-op driver for scripts/bench.sh (no process-per-file overhead).
 *
 *   fsops stat   LISTFILE        lstat() every path in LISTFILE (one per line, relative
 *                                to the cwd); exit 1 on the first failure
 *   fsops create DIR N SIZE      create DIR/f00000..f{N-1}, each SIZE bytes, O_EXCL
 *   fsops unlink DIR N           unlink DIR/f00000..f{N-1}
 *
 * Prints the number of entries handled on stdout (the bench checks it).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int do_stat(const char *list) {
    FILE *f = fopen(list, "r");
    if (!f) { perror(list); return 1; }
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    long count = 0;
    struct stat st;
    while ((n = getline(&line, &cap, f)) > 0) {
        if (line[n - 1] == '\n') line[--n] = 0;
        if (n == 0) continue;
        if (lstat(line, &st) != 0) {
            fprintf(stderr, "lstat %s: %s\n", line, strerror(errno));
            return 1;
        }
        count++;
    }
    printf("%ld\n", count);
    return 0;
}

static int do_create(const char *dir, long n, long size) {
    char path[4096], buf[65536];
    if (size > (long)sizeof buf) size = sizeof buf;
    for (long i = 0; i < size; i++) buf[i] = 'a' + (i % 26);
    if (size > 0) buf[size - 1] = '\n';
    for (long i = 0; i < n; i++) {
        snprintf(path, sizeof path, "%s/f%05ld", dir, i);
        int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd < 0) { fprintf(stderr, "create %s: %s\n", path, strerror(errno)); return 1; }
        if (size > 0 && write(fd, buf, size) != size) {
            fprintf(stderr, "write %s: %s\n", path, strerror(errno));
            return 1;
        }
        if (close(fd) != 0) { fprintf(stderr, "close %s: %s\n", path, strerror(errno)); return 1; }
    }
    printf("%ld\n", n);
    return 0;
}

static int do_unlink(const char *dir, long n) {
    char path[4096];
    for (long i = 0; i < n; i++) {
        snprintf(path, sizeof path, "%s/f%05ld", dir, i);
        if (unlink(path) != 0) { fprintf(stderr, "unlink %s: %s\n", path, strerror(errno)); return 1; }
    }
    printf("%ld\n", n);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "stat")) return do_stat(argv[2]);
    if (argc == 5 && !strcmp(argv[1], "create")) return do_create(argv[2], atol(argv[3]), atol(argv[4]));
    if (argc == 4 && !strcmp(argv[1], "unlink")) return do_unlink(argv[2], atol(argv[3]));
    fprintf(stderr, "usage: fsops stat LIST | create DIR N SIZE | unlink DIR N\n");
    return 2;
}
