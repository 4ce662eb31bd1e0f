/*
 * chapters/09-engine/model/mapped_file.c - read-only file mappings and JSON files
 * read through them (see mapped_file.h).
 */
#include "chapters/09-engine/model/mapped_file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/check.h"

int mapped_file_open(const char *path, mapped_file_t *f) {
    *f = (mapped_file_t){0};
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return mv_error("%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        int err = errno;
        close(fd);
        return mv_error("%s: not a regular file%s%s", path, err ? ": " : "", err ? strerror(err) : "");
    }
    f->size = (size_t)st.st_size;
    // mmap refuses a length of 0, and an empty file has nothing to map.
    if (f->size > 0) {
        // MAP_PRIVATE + PROT_READ: nobody can write through the mapping, and
        // the pages stay shared with the page cache.
        void *p = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            int err = errno;
            close(fd);
            return mv_error("%s: cannot mmap %zu bytes: %s", path, f->size, strerror(err));
        }
        f->data = p;
    }
    close(fd);  // the mapping keeps the file alive on its own
    f->path = strdup(path);
    if (!f->path) {
        mapped_file_close(f);
        return mv_error("%s: out of memory", path);
    }
    return 0;
}

void mapped_file_close(mapped_file_t *f) {
    if (f->data) munmap((void *)f->data, f->size);
    free(f->path);
    *f = (mapped_file_t){0};
}

cJSON *json_load_file(const char *path) {
    mapped_file_t f;
    if (mapped_file_open(path, &f)) return NULL;
    const char *text = (const char *)f.data, *end = NULL;
    // Length-bounded parse: the mapping has no terminating NUL. The last
    // argument 0 lets trailing bytes through; they are checked below.
    cJSON *root = f.size ? cJSON_ParseWithLengthOpts(text, f.size, &end, 0) : NULL;
    if (root) {
        size_t at = (size_t)(end - text);
        while (at < f.size && strchr(" \t\r\n", text[at]) && text[at]) at++;
        if (at < f.size) {
            cJSON_Delete(root);
            root = NULL;
            mv_error("%s: not valid JSON: unexpected bytes after the value at byte %zu", path, at);
        }
    } else {
        // cJSON points at where parsing stopped: report it as a byte offset.
        const char *err = cJSON_GetErrorPtr();
        long off = err && f.size && err >= text && err <= text + f.size ? (long)(err - text) : 0;
        mv_error("%s: not valid JSON (stopped near byte %ld; empty or truncated file?)", path, off);
    }
    mapped_file_close(&f);
    return root;
}

int file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}
