/*
 * edgesdk's QEMU TCG plugin: guest instructions retired, in total and by class, reported at
 * marks the guest sets with a syscall of its own number (edgesdk.converters.board.emulate).
 *
 * Counting is inline (no helper call per block): each translated block adds its instruction
 * counts to the counters when it runs, so the guest runs at close to plain TCG speed.
 * Classes, decided once per instruction at translation time:
 *   simd   vector or floating-point data processing (aarch64: op0 = x111; x86: an xmm/ymm/zmm,
 *          MMX or x87 operand, read from the disassembly)
 *   memory a load or a store (aarch64: op0 = x1x0; x86: a memory operand "(%reg...)", not lea/nop)
 * On x86 an instruction can be both.
 *
 * QEMU ships no development header for plugins in Debian, so the few entry points used here
 * are declared below, as QEMU's plugin API (version 1: QEMU 4.2 to 8.x) defines them.
 * Built by edgesdk with: cc -O2 -shared -fPIC -fvisibility=hidden insn_count.c -o libinsn.so
 */
#include <inttypes.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))
#define MARK_SYSCALL 4242 /* the guest calls syscall(4242, tag): no Linux ABI uses this number */

typedef uint64_t qemu_plugin_id_t;
typedef struct {
    const char *target_name;
    struct { int min; int cur; } version;
    bool system_emulation;
    union { struct { int smp_vcpus; int max_vcpus; } system; };
} qemu_info_t;
struct qemu_plugin_tb;
struct qemu_plugin_insn;
enum qemu_plugin_op { QEMU_PLUGIN_INLINE_ADD_U64 };
typedef void (*tb_trans_cb_t)(qemu_plugin_id_t, struct qemu_plugin_tb *);
typedef void (*udata_cb_t)(qemu_plugin_id_t, void *);
typedef void (*syscall_cb_t)(qemu_plugin_id_t, unsigned int, int64_t, uint64_t, uint64_t, uint64_t, uint64_t,
                             uint64_t, uint64_t, uint64_t, uint64_t);
void qemu_plugin_register_vcpu_tb_trans_cb(qemu_plugin_id_t, tb_trans_cb_t);
void qemu_plugin_register_vcpu_tb_exec_inline(struct qemu_plugin_tb *, enum qemu_plugin_op, void *, uint64_t);
void qemu_plugin_register_vcpu_syscall_cb(qemu_plugin_id_t, syscall_cb_t);
void qemu_plugin_register_atexit_cb(qemu_plugin_id_t, udata_cb_t, void *);
size_t qemu_plugin_tb_n_insns(const struct qemu_plugin_tb *);
struct qemu_plugin_insn *qemu_plugin_tb_get_insn(const struct qemu_plugin_tb *, size_t);
const void *qemu_plugin_insn_data(const struct qemu_plugin_insn *);
size_t qemu_plugin_insn_size(const struct qemu_plugin_insn *);
char *qemu_plugin_insn_disas(const struct qemu_plugin_insn *);
void qemu_plugin_outs(const char *);

EXPORT int qemu_plugin_version = 1;

enum { TOTAL, SIMD, MEMORY, CLASSES };
static uint64_t counts[CLASSES];
static bool aarch64;

static void classify_a64(const struct qemu_plugin_insn *insn, uint64_t *n) {
    uint32_t word;
    if (qemu_plugin_insn_size(insn) != 4) return;
    memcpy(&word, qemu_plugin_insn_data(insn), 4);
    unsigned op0 = (word >> 25) & 0xf;
    if ((op0 & 0x7) == 0x7) n[SIMD]++;
    else if ((op0 & 0x5) == 0x4) n[MEMORY]++;
}

static void classify_x86(const struct qemu_plugin_insn *insn, uint64_t *n) {
    char *text = qemu_plugin_insn_disas(insn); /* AT&T syntax: "vfmadd231ps (%rax), %ymm1, %ymm2" */
    if (!text) return;
    if (strstr(text, "mm") || strstr(text, "%st")) n[SIMD]++; /* %xmm, %ymm, %zmm, %mm (MMX), x87 */
    bool address_only = strncmp(text, "lea", 3) == 0 || strncmp(text, "nop", 3) == 0;
    if (!address_only && (strstr(text, "(%") || strstr(text, "(,"))) n[MEMORY]++;
    free(text);
}

static void translated(qemu_plugin_id_t id, struct qemu_plugin_tb *tb) {
    uint64_t n[CLASSES] = {0};
    n[TOTAL] = qemu_plugin_tb_n_insns(tb);
    for (size_t i = 0; i < n[TOTAL]; i++) {
        const struct qemu_plugin_insn *insn = qemu_plugin_tb_get_insn(tb, i);
        if (aarch64) classify_a64(insn, n); else classify_x86(insn, n);
    }
    for (int c = 0; c < CLASSES; c++)
        if (n[c]) qemu_plugin_register_vcpu_tb_exec_inline(tb, QEMU_PLUGIN_INLINE_ADD_U64, &counts[c], n[c]);
}

static void report(const char *what) {
    char line[160];
    snprintf(line, sizeof line, "%s total=%" PRIu64 " simd=%" PRIu64 " memory=%" PRIu64 "\n", what, counts[TOTAL],
             counts[SIMD], counts[MEMORY]);
    qemu_plugin_outs(line);
}

static void syscall_entered(qemu_plugin_id_t id, unsigned int vcpu, int64_t num, uint64_t tag, uint64_t a2,
                            uint64_t a3, uint64_t a4, uint64_t a5, uint64_t a6, uint64_t a7, uint64_t a8) {
    if (num != MARK_SYSCALL) return;
    char what[48];
    snprintf(what, sizeof what, "edgesdk-mark %" PRIu64, tag);
    report(what);
}

static void exited(qemu_plugin_id_t id, void *unused) { report("edgesdk-exit"); }

EXPORT int qemu_plugin_install(qemu_plugin_id_t id, const qemu_info_t *info, int argc, char **argv) {
    aarch64 = strcmp(info->target_name, "aarch64") == 0;
    qemu_plugin_register_vcpu_tb_trans_cb(id, translated);
    qemu_plugin_register_vcpu_syscall_cb(id, syscall_entered);
    qemu_plugin_register_atexit_cb(id, exited, NULL);
    return 0;
}
