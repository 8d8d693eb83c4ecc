/* What one uprobe trap costs on this machine, apart from any program's
 * work: a loop calls a two-instruction function whose first instruction
 * the kernel emulates (nop) or must single-step (lea), or a 5-byte nop
 * (which kernels from 6.18 turn into a call to a trampoline that enters
 * the kernel by syscall instead of a trap), and a loop of getppid()
 * gives the price of a plain kernel entry beside it. A loop of `verw`
 * (mode 4) prices what kernels that mitigate MDS or TSA run on every
 * return to user space: where the CPU's microcode clears its buffers on
 * `verw`, it costs hundreds of cycles, in user mode as in the kernel.
 * run.sh runs it bare and with a counting bpftrace uprobe on each
 * function.
 * Usage: trap CALLS MODE (0: nop first, 2: lea first, 1: getppid,
 * 3: nop5 first, 4: verw). */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>
int probe_me(int x);
int probe_lea(int x);
int probe_nop5(int x);
asm(".text\n.globl probe_me\n.type probe_me,@function\nprobe_me:\n nop\n lea 1(%rdi),%eax\n ret\n.size probe_me,.-probe_me\n"
    ".globl probe_lea\n.type probe_lea,@function\nprobe_lea:\n lea 1(%rdi),%eax\n ret\n.size probe_lea,.-probe_lea\n"
    ".globl probe_nop5\n.type probe_nop5,@function\nprobe_nop5:\n .byte 0x0f,0x1f,0x44,0x00,0x00\n lea 1(%rdi),%eax\n ret\n.size probe_nop5,.-probe_nop5\n");
/* The operand is Linux's user data selector, writable at CPL 3. */
static void verw(void) {
    static const unsigned short user_ds = 0x2b;
    asm volatile("verw %0" : : "m"(user_ds) : "cc");
}
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e9 + t.tv_nsec; }
int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 1000000;
    int mode = argc > 2 ? atoi(argv[2]) : 0;
    volatile int acc = 0;
    double t0 = now();
    for (long i = 0; i < n; i++) {
        if (mode == 0) acc = probe_me(acc);
        else if (mode == 2) acc = probe_lea(acc);
        else if (mode == 3) acc = probe_nop5(acc);
        else if (mode == 4) verw();
        else syscall(SYS_getppid);
    }
    double t1 = now();
    const char *what = mode == 0 ? "call(nop)" : mode == 2 ? "call(lea)" : mode == 3 ? "call(nop5)" : mode == 4 ? "verw" : "getppid";
    printf("%s %.1f ns per call\n", what, (t1 - t0) / n);
    return 0;
}
