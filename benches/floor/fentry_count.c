// The floor of a design that does not trap the server: one counting BPF
// program at the entry of a kernel function (fentry, through a BPF
// trampoline), filtered on one process. bpftrace 0.17 says `kfunc: no` on
// kernel 6.18, so this loads its few instructions itself.
//
//   gcc -O2 -o fentry_count benches/floor/fentry_count.c
//   fentry_count FUNCTION PID      e.g. __sys_sendto, unix_stream_sendmsg
//   fentry_count raw:NAME PID      a raw tracepoint instead (raw:sys_enter)
//
// Counts the calls PID's threads make until SIGINT or SIGTERM, then prints
// `FUNCTION: N`. Exits 2 when the kernel refuses, with its reason: on the
// machines of 2026-12-04 a tracing program's load fails with EPERM before
// the verifier runs, while a raw tracepoint loads and attaches.
#include <errno.h>
#include <fcntl.h>
#include <linux/bpf.h>
#include <linux/btf.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

static volatile sig_atomic_t stop;

static void on_signal(int sig) {
    (void)sig;
    stop = 1;
}

static long bpf(int cmd, union bpf_attr *attr) {
    return syscall(__NR_bpf, cmd, attr, sizeof(*attr));
}

// The BTF id of the kernel function `name` in /sys/kernel/btf/vmlinux.
static int vmlinux_func_id(const char *name) {
    int fd = open("/sys/kernel/btf/vmlinux", O_RDONLY);
    if (fd < 0) return -1;
    struct stat st;
    if (fstat(fd, &st) != 0) return -1;
    char *raw = malloc(st.st_size);
    if (!raw) return -1;
    // sysfs hands a binary file out a page or so per read.
    for (off_t got = 0; got < st.st_size;) {
        ssize_t n = read(fd, raw + got, st.st_size - got);
        if (n <= 0) return -1;
        got += n;
    }
    close(fd);
    struct btf_header *h = (struct btf_header *)raw;
    char *types = raw + h->hdr_len + h->type_off;
    char *end = types + h->type_len;
    char *strings = raw + h->hdr_len + h->str_off;
    int id = 1;
    for (char *p = types; p < end; id++) {
        struct btf_type *t = (struct btf_type *)p;
        int kind = BTF_INFO_KIND(t->info), vlen = BTF_INFO_VLEN(t->info);
        if (kind == BTF_KIND_FUNC && strcmp(strings + t->name_off, name) == 0) return id;
        p += sizeof(*t);
        switch (kind) {
        case BTF_KIND_INT: p += 4; break;
        case BTF_KIND_ARRAY: p += sizeof(struct btf_array); break;
        case BTF_KIND_STRUCT:
        case BTF_KIND_UNION: p += vlen * sizeof(struct btf_member); break;
        case BTF_KIND_ENUM: p += vlen * sizeof(struct btf_enum); break;
        case BTF_KIND_ENUM64: p += vlen * 12; break;
        case BTF_KIND_FUNC_PROTO: p += vlen * sizeof(struct btf_param); break;
        case BTF_KIND_VAR: p += sizeof(struct btf_var); break;
        case BTF_KIND_DATASEC: p += vlen * sizeof(struct btf_var_secinfo); break;
        case BTF_KIND_DECL_TAG: p += 4; break;
        default: break;
        }
    }
    return -1;
}

#define INSN(code, dst, src, off, imm) ((struct bpf_insn){code, dst, src, off, imm})

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s FUNCTION|raw:TRACEPOINT PID\n", argv[0]);
        return 1;
    }
    const char *function = argv[1];
    int pid = atoi(argv[2]);
    // `raw:NAME`: a raw tracepoint instead (sys_enter: every syscall).
    const char *raw_tp = strncmp(function, "raw:", 4) == 0 ? function + 4 : NULL;
    int func_id = raw_tp ? 0 : vmlinux_func_id(function);
    if (func_id < 0) {
        fprintf(stderr, "fentry_count: %s is not in the kernel's BTF\n", function);
        return 2;
    }

    union bpf_attr attr;
    memset(&attr, 0, sizeof(attr));
    attr.map_type = BPF_MAP_TYPE_PERCPU_ARRAY;
    attr.key_size = 4;
    attr.value_size = 8;
    attr.max_entries = 1;
    int map = bpf(BPF_MAP_CREATE, &attr);
    if (map < 0) {
        fprintf(stderr, "fentry_count: map: %s\n", strerror(errno));
        return 2;
    }

    // Another pid jumps to `r0 = 0; exit`; offsets count the map load as two.
    struct bpf_insn prog[] = {
        INSN(BPF_JMP | BPF_CALL, 0, 0, 0, BPF_FUNC_get_current_pid_tgid),
        INSN(BPF_ALU64 | BPF_RSH | BPF_K, BPF_REG_0, 0, 0, 32),
        INSN(BPF_JMP | BPF_JNE | BPF_K, BPF_REG_0, 0, 10, pid),
        INSN(BPF_ST | BPF_MEM | BPF_W, BPF_REG_10, 0, -4, 0),
        INSN(BPF_ALU64 | BPF_MOV | BPF_X, BPF_REG_2, BPF_REG_10, 0, 0),
        INSN(BPF_ALU64 | BPF_ADD | BPF_K, BPF_REG_2, 0, 0, -4),
        INSN(BPF_LD | BPF_DW | BPF_IMM, BPF_REG_1, BPF_PSEUDO_MAP_FD, 0, map),
        INSN(0, 0, 0, 0, 0),
        INSN(BPF_JMP | BPF_CALL, 0, 0, 0, BPF_FUNC_map_lookup_elem),
        INSN(BPF_JMP | BPF_JEQ | BPF_K, BPF_REG_0, 0, 3, 0),
        INSN(BPF_LDX | BPF_MEM | BPF_DW, BPF_REG_1, BPF_REG_0, 0, 0),
        INSN(BPF_ALU64 | BPF_ADD | BPF_K, BPF_REG_1, 0, 0, 1),
        INSN(BPF_STX | BPF_MEM | BPF_DW, BPF_REG_0, BPF_REG_1, 0, 0),
        INSN(BPF_ALU64 | BPF_MOV | BPF_K, BPF_REG_0, 0, 0, 0),
        INSN(BPF_JMP | BPF_EXIT, 0, 0, 0, 0),
    };
    static char log[65536];
    memset(&attr, 0, sizeof(attr));
    if (raw_tp) {
        attr.prog_type = BPF_PROG_TYPE_RAW_TRACEPOINT;
    } else {
        attr.prog_type = BPF_PROG_TYPE_TRACING;
        attr.expected_attach_type = BPF_TRACE_FENTRY;
        attr.attach_btf_id = func_id;
    }
    attr.insns = (uint64_t)(uintptr_t)prog;
    attr.insn_cnt = sizeof(prog) / sizeof(prog[0]);
    attr.license = (uint64_t)(uintptr_t)"GPL";
    attr.log_buf = (uint64_t)(uintptr_t)log;
    attr.log_size = sizeof(log);
    attr.log_level = 1;
    strncpy(attr.prog_name, "fentry_count", sizeof(attr.prog_name) - 1);
    int prog_fd = bpf(BPF_PROG_LOAD, &attr);
    if (prog_fd < 0) {
        fprintf(stderr, "fentry_count: load at %s: %s\n%s\n", function, strerror(errno), log);
        return 2;
    }
    memset(&attr, 0, sizeof(attr));
    attr.raw_tracepoint.prog_fd = prog_fd;
    attr.raw_tracepoint.name = (uint64_t)(uintptr_t)raw_tp;
    int link = bpf(BPF_RAW_TRACEPOINT_OPEN, &attr);
    if (link < 0) {
        fprintf(stderr, "fentry_count: attach at %s: %s\n", function, strerror(errno));
        return 2;
    }
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    fprintf(stderr, "fentry_count: attached at %s for pid %d\n", function, pid);
    while (!stop) pause();
    close(link);

    long cpus = sysconf(_SC_NPROCESSORS_CONF);
    uint64_t *values = calloc(cpus, sizeof(uint64_t)), total = 0;
    uint32_t key = 0;
    memset(&attr, 0, sizeof(attr));
    attr.map_fd = map;
    attr.key = (uint64_t)(uintptr_t)&key;
    attr.value = (uint64_t)(uintptr_t)values;
    if (bpf(BPF_MAP_LOOKUP_ELEM, &attr) == 0)
        for (long i = 0; i < cpus; i++) total += values[i];
    printf("%s: %llu\n", function, (unsigned long long)total);
    return 0;
}
