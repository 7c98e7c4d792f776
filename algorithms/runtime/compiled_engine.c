/* The compiled engine: runs one rank's whole plan (algorithms/runtime/plan.py) in one call, within
 * a node, over channels in memory the node's ranks share (algorithms/runtime/compiled.py builds
 * the program and the channels; this file interprets them; it knows no algorithm).
 *
 * Channels. For each ordered pair of ranks (a, b) a ring of DEPTH slots of SLOT bytes carries a's
 * messages to b: a's count of fragments posted (head, written by a alone) and b's count taken
 * (tail, written by b alone) on cache lines of their own, then the slots, each a line ahead of
 * its bytes. A message of L bytes is max(1, ceil(L / SLOT)) fragments; both ends count them
 * from their own L, equal in a well formed plan. A sender writes fragment k into slot k mod
 * DEPTH once k - tail < DEPTH, then publishes the slot's flag = k + 1 (release) and head = k + 1;
 * the receiver reads it once the flag is k + 1 (acquire), copies or reduces it into place and
 * publishes tail = k + 1 (release). A flag is never stale: a slot's earlier fragments carried
 * smaller numbers, and nothing else is written there. Messages between two ranks match in the
 * order they are posted, as MPI's do.
 *
 * So that a small message costs as few cache lines crossing between cores as it can: a fragment
 * of at most INLINE bytes lies in its flag's line, after the flag, so the receiver finds the
 * flag and the bytes in one line (as NCCL's LL protocol does; a larger one starts on the next
 * line); and a sender keeps, in its head's line, the last tail it read, and reads the receiver's
 * tail again only when that one leaves no slot free.
 *
 * Progress. Sends and receives are kept pending until complete; every wait advances all of them
 * in their posting order (a send to b waits behind an earlier send to b, a receive from a behind
 * an earlier receive from a), so a plan that completes under MPI's rules completes here: a send
 * here completes no later than a rendezvous send would. A receive may complete before its wait;
 * a plan promises not to touch its target (or write its accumulator) until then.
 *
 * A wait spins; after SPINS polls it lets go of the GIL and gives the core away between polls
 * (oversubscribed runs), and on the main thread lets Python handle a pending signal now and then
 * (PyErr_CheckSignals), so a job that is told to end ends here too.
 *
 * Arithmetic: into = acc (op) received, element by element, in the type's own arithmetic, the
 * same bits as NumPy's and ml_dtypes' ufuncs: integers wrap (computed unsigned), float16 is
 * widened to float and rounded back once (NumPy's npy_half loops), bfloat16 by kernels/bfloat16.h,
 * and the two 8-bit floats by a 256 x 256 table per op that ml_dtypes itself filled. max and min
 * pick an operand as NumPy's loops do, which differ only where the two compare equal (the sign of
 * a zero): acc when it is NaN or above (below) the other, else the other, for float32 and float64
 * (NumPy's SIMD loops, x86's maxps); acc when it is NaN or not below (above) the other for
 * float16 (NumPy's scalar loop); bfloat16 as ml_dtypes (kernels/bfloat16.h). Build with
 * -ffp-contract=off and without -ffast-math; -O3 vectorises the element-wise loops, which keeps
 * every element's operation and so its bits. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <sched.h>
#include <stdint.h>
#include <string.h>

#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/ndarraytypes.h> /* the array's fields, read by the inline accessors (no API table) */

#include "../kernels/bfloat16.h"

/* the program's header words (compiled.py writes them in this order) */
enum { H_SIZE, H_RANK, H_CHANNELS, H_SLOT, H_DEPTH, H_STRIDE, H_TYPE, H_OP, H_TABLE, H_SCRATCH, H_STEPS,
       H_HANDLES, H_SPINS, H_WAITS, H_WORDS };
/* a step's words */
enum { S_KIND, S_TO, S_SOURCE, S_SEND_VEC, S_SEND_OFF, S_SEND_LEN, S_ACC_VEC, S_ACC_OFF, S_INTO_VEC, S_INTO_OFF,
       S_INTO_LEN, S_HANDLE, S_WORDS };
enum { K_ISEND, K_WAIT, K_SEND, K_RECV, K_RECV_REDUCE, K_IRECV, K_IRECV_REDUCE, K_SENDRECV, K_SENDRECV_REDUCE,
       K_COPY, K_COMBINE, K_ZERO };
enum { T_I8, T_I16, T_I32, T_I64, T_U8, T_U16, T_U32, T_U64, T_F16, T_F32, T_F64, T_BF16, T_F8 };
enum { O_SUM, O_PROD, O_MAX, O_MIN };
#define LINE 64
#define MAX_PENDING 256
#define INLINE (LINE - 8) /* a fragment this small lies in its flag's line */

static unsigned long main_thread; /* the thread that imported the module: Python's signals run there */

typedef struct {
    int64_t peer, len, total, done; /* bytes; fragments in all and moved */
    char *data;                     /* a send's bytes, a receive's target */
    const char *acc;                /* a reducing receive's accumulator, else NULL */
    int64_t handle;                 /* the handle its completion marks, -1 none */
} Pending;

typedef struct {
    const int64_t *h;
    char *channels;
    char *vectors[4]; /* input, output, partial, scratch */
    Pending sends[MAX_PENDING], recvs[MAX_PENDING];
    int nsends, nrecvs;
    unsigned char *done; /* per handle: complete */
} Run;

static inline volatile uint64_t *head_of(Run *r, int64_t from, int64_t to)
{
    return (volatile uint64_t *)(r->channels + (from * r->h[H_SIZE] + to) * r->h[H_STRIDE]);
}

static inline volatile uint64_t *tail_of(Run *r, int64_t from, int64_t to)
{
    return (volatile uint64_t *)((char *)head_of(r, from, to) + LINE);
}

/* slot k mod DEPTH of the channel from -> to: its flag, then (a line on, or after the flag for a
 * fragment of at most INLINE bytes) its bytes */
static inline char *slot_of(Run *r, int64_t from, int64_t to, uint64_t k)
{
    return (char *)head_of(r, from, to) + 2 * LINE + (int64_t)(k % (uint64_t)r->h[H_DEPTH]) * (LINE + r->h[H_SLOT]);
}

static inline char *bytes_of(char *slot, int64_t n)
{
    return slot + (n <= INLINE ? 8 : LINE);
}

/* ---- arithmetic: into[i] = acc[i] (op) src[i] ---- */

#define INTEGER(T, U)                                                                                  \
    static void reduce_##T(int op, T *into, const T *acc, const T *src, int64_t n)                     \
    {                                                                                                  \
        int64_t i;                                                                                     \
        switch (op) {                                                                                  \
        case O_SUM: for (i = 0; i < n; i++) into[i] = (T)((U)acc[i] + (U)src[i]); break;               \
        case O_PROD: for (i = 0; i < n; i++) into[i] = (T)((U)acc[i] * (U)src[i]); break;              \
        case O_MAX: for (i = 0; i < n; i++) into[i] = acc[i] >= src[i] ? acc[i] : src[i]; break;       \
        default: for (i = 0; i < n; i++) into[i] = acc[i] <= src[i] ? acc[i] : src[i]; break;          \
        }                                                                                              \
    }
INTEGER(int8_t, uint8_t)
INTEGER(int16_t, uint16_t)
INTEGER(int32_t, uint32_t)
INTEGER(int64_t, uint64_t)
INTEGER(uint8_t, uint8_t)
INTEGER(uint16_t, uint16_t)
INTEGER(uint32_t, uint32_t)
INTEGER(uint64_t, uint64_t)

#define FLOATING(T)                                                                                    \
    static void reduce_##T(int op, T *into, const T *acc, const T *src, int64_t n)                     \
    {                                                                                                  \
        int64_t i;                                                                                     \
        switch (op) {                                                                                  \
        case O_SUM: for (i = 0; i < n; i++) into[i] = acc[i] + src[i]; break;                          \
        case O_PROD: for (i = 0; i < n; i++) into[i] = acc[i] * src[i]; break;                         \
        case O_MAX: for (i = 0; i < n; i++) into[i] = acc[i] > src[i] || acc[i] != acc[i] ? acc[i] : src[i]; break; \
        default: for (i = 0; i < n; i++) into[i] = acc[i] < src[i] || acc[i] != acc[i] ? acc[i] : src[i]; break;    \
        }                                                                                              \
    }
FLOATING(float)
FLOATING(double)

static void reduce_half(int op, _Float16 *into, const _Float16 *acc, const _Float16 *src, int64_t n)
{
    int64_t i;
    for (i = 0; i < n; i++) {
        float a = (float)acc[i], b = (float)src[i];
        switch (op) {
        case O_SUM: into[i] = (_Float16)(a + b); break;
        case O_PROD: into[i] = (_Float16)(a * b); break;
        case O_MAX: into[i] = a >= b || a != a ? acc[i] : src[i]; break;
        default: into[i] = a <= b || a != a ? acc[i] : src[i]; break;
        }
    }
}

static void reduce_bf16(int op, uint16_t *into, const uint16_t *acc, const uint16_t *src, int64_t n)
{
    int64_t i;
    switch (op) {
    case O_SUM: for (i = 0; i < n; i++) into[i] = bf16_add(acc[i], src[i]); break;
    case O_PROD: for (i = 0; i < n; i++) into[i] = bf16_mul(acc[i], src[i]); break;
    case O_MAX: for (i = 0; i < n; i++) into[i] = bf16_max(acc[i], src[i]); break;
    default: for (i = 0; i < n; i++) into[i] = bf16_min(acc[i], src[i]); break;
    }
}

static void reduce_table(const uint8_t *table, uint8_t *into, const uint8_t *acc, const uint8_t *src, int64_t n)
{
    int64_t i;
    for (i = 0; i < n; i++)
        into[i] = table[(acc[i] << 8) | src[i]];
}

static void reduce(const int64_t *h, char *into, const char *acc, const char *src, int64_t bytes)
{
    int op = (int)h[H_OP];
    switch (h[H_TYPE]) {
    case T_I8: reduce_int8_t(op, (int8_t *)into, (const int8_t *)acc, (const int8_t *)src, bytes); break;
    case T_I16: reduce_int16_t(op, (int16_t *)into, (const int16_t *)acc, (const int16_t *)src, bytes / 2); break;
    case T_I32: reduce_int32_t(op, (int32_t *)into, (const int32_t *)acc, (const int32_t *)src, bytes / 4); break;
    case T_I64: reduce_int64_t(op, (int64_t *)into, (const int64_t *)acc, (const int64_t *)src, bytes / 8); break;
    case T_U8: reduce_uint8_t(op, (uint8_t *)into, (const uint8_t *)acc, (const uint8_t *)src, bytes); break;
    case T_U16: reduce_uint16_t(op, (uint16_t *)into, (const uint16_t *)acc, (const uint16_t *)src, bytes / 2); break;
    case T_U32: reduce_uint32_t(op, (uint32_t *)into, (const uint32_t *)acc, (const uint32_t *)src, bytes / 4); break;
    case T_U64: reduce_uint64_t(op, (uint64_t *)into, (const uint64_t *)acc, (const uint64_t *)src, bytes / 8); break;
    case T_F16: reduce_half(op, (_Float16 *)into, (const _Float16 *)acc, (const _Float16 *)src, bytes / 2); break;
    case T_F32: reduce_float(op, (float *)into, (const float *)acc, (const float *)src, bytes / 4); break;
    case T_F64: reduce_double(op, (double *)into, (const double *)acc, (const double *)src, bytes / 8); break;
    case T_BF16: reduce_bf16(op, (uint16_t *)into, (const uint16_t *)acc, (const uint16_t *)src, bytes / 2); break;
    default:
        reduce_table((const uint8_t *)(intptr_t)h[H_TABLE], (uint8_t *)into, (const uint8_t *)acc,
                     (const uint8_t *)src, bytes);
    }
}

/* ---- messages ---- */

/* memmove, but backwards where glibc's would be slow: from about 2 KiB to a few hundred KiB its
 * memcpy is `rep movsb`, which some x86 cores (AMD EPYC here) run up to 16x slower when the
 * destination lies 1..63 bytes past the source modulo 4096 (store-to-load aliasing on the low 12
 * address bits), the distance of two vectors allocated one after the other (malloc's 16-byte
 * header). Copied backwards in 64-byte blocks, a load lies a page behind the stores it could
 * alias: 2.8 us for 64 KiB at that distance, against glibc's 33 (and its 1.3 at distance 0).
 * Backwards is right for any overlap with the destination above the source. */
static void copy_bytes(char *to, const char *from, size_t n)
{
    size_t apart = ((uintptr_t)to - (uintptr_t)from) & 4095;
    if (n < 2048 || n >= (512 << 10) || apart == 0 || apart >= LINE || (to < from && to + n > from)) {
        memmove(to, from, n);
        return;
    }
    while (n >= LINE) {
        char block[LINE];
        n -= LINE;
        memcpy(block, from + n, LINE);
        memcpy(to + n, block, LINE);
    }
    memmove(to, from, n);
}

/* Move what can move now, in posting order per peer; complete operations leave the lists and
 * mark their handle done. */
static void progress(Run *r)
{
    int64_t me = r->h[H_RANK], slot = r->h[H_SLOT], depth = r->h[H_DEPTH], size = r->h[H_SIZE];
    unsigned char busy[size > 0 ? size : 1];
    int i, kept;
    memset(busy, 0, sizeof busy);
    for (i = 0, kept = 0; i < r->nsends; i++) {
        Pending *p = &r->sends[i];
        if (!busy[p->peer]) {
            volatile uint64_t *head = head_of(r, me, p->peer), *tail = tail_of(r, me, p->peer);
            volatile uint64_t *seen = head + 1; /* the last tail this sender read */
            uint64_t k = *head;
            while (p->done < p->total) {
                if ((int64_t)(k - *seen) >= depth) {
                    uint64_t now = __atomic_load_n(tail, __ATOMIC_ACQUIRE);
                    if ((int64_t)(k - now) >= depth)
                        break;
                    *seen = now;
                }
                int64_t lo = p->done * slot, n = p->len - lo < slot ? p->len - lo : slot;
                char *into = slot_of(r, me, p->peer, k);
                if (n > 0)
                    copy_bytes(bytes_of(into, n), p->data + lo, (size_t)n);
                __atomic_store_n((uint64_t *)into, ++k, __ATOMIC_RELEASE);
                *head = k;
                p->done++;
            }
        }
        if (p->done < p->total) {
            busy[p->peer] = 1; /* later sends to this rank wait behind it */
            r->sends[kept++] = *p;
        } else if (p->handle >= 0) {
            r->done[p->handle] = 1;
        }
    }
    r->nsends = kept;
    memset(busy, 0, sizeof busy);
    for (i = 0, kept = 0; i < r->nrecvs; i++) {
        Pending *p = &r->recvs[i];
        if (!busy[p->peer]) {
            volatile uint64_t *tail = tail_of(r, p->peer, me);
            uint64_t k = *tail;
            while (p->done < p->total) {
                char *at_k = slot_of(r, p->peer, me, k);
                if (__atomic_load_n((uint64_t *)at_k, __ATOMIC_ACQUIRE) != k + 1)
                    break;
                int64_t lo = p->done * slot, n = p->len - lo < slot ? p->len - lo : slot;
                const char *from = bytes_of(at_k, n);
                if (p->acc)
                    reduce(r->h, p->data + lo, p->acc + lo, from, n);
                else if (n > 0)
                    copy_bytes(p->data + lo, from, (size_t)n);
                __atomic_store_n(tail, ++k, __ATOMIC_RELEASE);
                p->done++;
            }
        }
        if (p->done < p->total) {
            busy[p->peer] = 1;
            r->recvs[kept++] = *p;
        } else if (p->handle >= 0) {
            r->done[p->handle] = 1;
        }
    }
    r->nrecvs = kept;
}

static int post(Run *r, Pending *list, int *count, int64_t peer, char *data, const char *acc, int64_t len,
                int64_t handle)
{
    if (*count >= MAX_PENDING) {
        PyErr_SetString(PyExc_RuntimeError, "compiled engine: more than 256 messages in flight");
        return -1;
    }
    int64_t slot = r->h[H_SLOT];
    Pending p = {peer, len, len <= slot ? 1 : (len + slot - 1) / slot, 0, data, acc, handle};
    list[(*count)++] = p;
    if (handle >= 0)
        r->done[handle] = 0;
    return 0;
}

/* Spin until every handle of ``handles`` is done, moving messages meanwhile. After the first
 * SPINS polls the wait lets go of the GIL (other threads run: a training step's computation
 * beside a hook's all-reduce, a collective of another library on the main thread) and gives the
 * core away between polls; on the main thread it takes the GIL back now and then to let Python
 * handle a signal. */
static int wait_for(Run *r, const int64_t *handles, int64_t count)
{
    int64_t spins = 0, yields = 0, limit = r->h[H_SPINS], i;
    PyThreadState *released = NULL;
    int failed = 0;
    for (;;) {
        progress(r);
        for (i = 0; i < count && r->done[handles[i]]; i++)
            ;
        if (i == count)
            break;
        if (++spins < limit)
            continue;
        spins = 0;
        if (released == NULL)
            released = PyEval_SaveThread();
        sched_yield();
        if (++yields % 16 == 0 && PyThread_get_thread_ident() == main_thread) {
            PyEval_RestoreThread(released);
            released = NULL;
            if (PyErr_CheckSignals() < 0) {
                failed = -1;
                break;
            }
        }
    }
    if (released != NULL)
        PyEval_RestoreThread(released);
    return failed;
}

static inline char *at(Run *r, const int64_t *s, int which)
{
    return r->vectors[s[which]] + s[which + 1];
}

/* The plan ``program`` (bytes: the header, the steps, the waits' handles) run on the vectors at
 * those addresses (NULL where the plan names none); 0, or -1 with an exception set. */
static int run_program(PyObject *program, char *input, char *output, char *partial)
{
    Run r;
    r.h = (const int64_t *)PyBytes_AS_STRING(program);
    r.channels = (char *)(intptr_t)r.h[H_CHANNELS];
    r.vectors[0] = input;
    r.vectors[1] = output;
    r.vectors[2] = partial;
    r.vectors[3] = (char *)(intptr_t)r.h[H_SCRATCH];
    r.nsends = r.nrecvs = 0;
    unsigned char done[r.h[H_HANDLES] + 2];
    r.done = done;
    const int64_t *steps = r.h + H_WORDS, *waits = steps + r.h[H_STEPS] * S_WORDS;
    int64_t self_handles[2] = {r.h[H_HANDLES], r.h[H_HANDLES] + 1}; /* a blocking step's own */
    for (int64_t i = 0; i < r.h[H_STEPS]; i++) {
        const int64_t *s = steps + i * S_WORDS;
        int failed = 0;
        switch (s[S_KIND]) {
        case K_ISEND:
            failed = post(&r, r.sends, &r.nsends, s[S_TO], at(&r, s, S_SEND_VEC), NULL, s[S_SEND_LEN], s[S_HANDLE]);
            break;
        case K_SEND:
            failed = post(&r, r.sends, &r.nsends, s[S_TO], at(&r, s, S_SEND_VEC), NULL, s[S_SEND_LEN], self_handles[0])
                     || wait_for(&r, self_handles, 1);
            break;
        case K_WAIT:
            failed = wait_for(&r, waits + s[S_SEND_OFF], s[S_SEND_LEN]);
            break;
        case K_RECV:
        case K_RECV_REDUCE:
            failed = post(&r, r.recvs, &r.nrecvs, s[S_SOURCE], at(&r, s, S_INTO_VEC),
                          s[S_KIND] == K_RECV ? NULL : at(&r, s, S_ACC_VEC), s[S_INTO_LEN], self_handles[0])
                     || wait_for(&r, self_handles, 1);
            break;
        case K_IRECV:
        case K_IRECV_REDUCE:
            failed = post(&r, r.recvs, &r.nrecvs, s[S_SOURCE], at(&r, s, S_INTO_VEC),
                          s[S_KIND] == K_IRECV ? NULL : at(&r, s, S_ACC_VEC), s[S_INTO_LEN], s[S_HANDLE]);
            break;
        case K_SENDRECV:
        case K_SENDRECV_REDUCE:
            failed = post(&r, r.sends, &r.nsends, s[S_TO], at(&r, s, S_SEND_VEC), NULL, s[S_SEND_LEN], self_handles[0])
                     || post(&r, r.recvs, &r.nrecvs, s[S_SOURCE], at(&r, s, S_INTO_VEC),
                             s[S_KIND] == K_SENDRECV ? NULL : at(&r, s, S_ACC_VEC), s[S_INTO_LEN], self_handles[1])
                     || wait_for(&r, self_handles, 2);
            break;
        case K_COPY:
            if (s[S_INTO_LEN] > 0 && at(&r, s, S_INTO_VEC) != at(&r, s, S_SEND_VEC))
                copy_bytes(at(&r, s, S_INTO_VEC), at(&r, s, S_SEND_VEC), (size_t)s[S_INTO_LEN]);
            break;
        case K_COMBINE:
            reduce(r.h, at(&r, s, S_INTO_VEC), at(&r, s, S_ACC_VEC), at(&r, s, S_SEND_VEC), s[S_INTO_LEN]);
            break;
        case K_ZERO:
            if (s[S_INTO_LEN] > 0)
                memset(at(&r, s, S_INTO_VEC), 0, (size_t)s[S_INTO_LEN]);
            break;
        default:
            PyErr_Format(PyExc_ValueError, "compiled engine: unknown step kind %lld", (long long)s[S_KIND]);
            return -1;
        }
        if (failed)
            return -1;
    }
    if (r.nsends || r.nrecvs) {
        PyErr_SetString(PyExc_RuntimeError, "compiled engine: the plan ended with messages not waited for");
        return -1;
    }
    return 0;
}

/* The addresses that args[1..n] give (ints; 0 where the plan names no vector); -1 with an exception
 * set where one is not an int. */
static int addresses(PyObject *const *args, int n, char **out)
{
    for (int v = 0; v < n; v++) {
        out[v] = (char *)PyLong_AsVoidPtr(args[v + 1]);
        if (out[v] == NULL && PyErr_Occurred())
            return -1;
    }
    return 0;
}

/* run(program, input, output, partial): the plan on the vectors at those addresses (0 where the plan
 * names none). */
static PyObject *run(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    char *vectors[3];
    if (nargs != 4 || !PyBytes_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "run(program: bytes, input: int, output: int, partial: int)");
        return NULL;
    }
    if (addresses(args, 3, vectors) || run_program(args[0], vectors[0], vectors[1], vectors[2]))
        return NULL;
    Py_RETURN_NONE;
}

/* run_expecting(program, input, output, expected): the plan on the vectors at those addresses, then
 * whether the output's first len(expected) bytes are ``expected`` (the agreement's one check). */
static PyObject *run_expecting(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    char *vectors[2];
    if (nargs != 4 || !PyBytes_Check(args[0]) || !PyBytes_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "run_expecting(program: bytes, input: int, output: int, expected: bytes)");
        return NULL;
    }
    if (addresses(args, 2, vectors) || run_program(args[0], vectors[0], vectors[1], NULL))
        return NULL;
    return PyBool_FromLong(!memcmp(vectors[1], PyBytes_AS_STRING(args[3]), (size_t)PyBytes_GET_SIZE(args[3])));
}

/* ---- the same two vectors as the last call ----
 *
 * A call repeated on the same two arrays is run on what it checked then, once what can change in
 * place is seen unchanged: each array's type, data, dtype (descr), dimensions, strides and flags.
 * ``fingerprint(a, b)`` records them (the caller passes NumPy arrays of one dimension);
 * ``matches(print, a, b)`` says whether they still hold; ``run_if_same(program, print, a, b)`` runs
 * the all-reduce plan with a as its input and b as its output where they hold, and says so. */

typedef struct {
    PyTypeObject *type;
    char *data;
    PyArray_Descr *descr;
    npy_intp nd, dim, stride, flags;
} Array;

#define KEPT_FLAGS (NPY_ARRAY_WRITEABLE | NPY_ARRAY_ALIGNED | NPY_ARRAY_C_CONTIGUOUS)

static void describe(PyObject *obj, Array *out)
{
    PyArrayObject *a = (PyArrayObject *)obj;
    memset(out, 0, sizeof *out);
    out->type = Py_TYPE(obj);
    out->data = PyArray_DATA(a);
    out->descr = PyArray_DESCR(a);
    out->nd = PyArray_NDIM(a);
    if (out->nd == 1) {
        out->dim = PyArray_DIMS(a)[0];
        out->stride = PyArray_STRIDES(a)[0];
    }
    out->flags = PyArray_FLAGS(a) & KEPT_FLAGS;
}

static PyObject *fingerprint(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    Array both[2];
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "fingerprint(a, b): two NumPy arrays");
        return NULL;
    }
    describe(args[0], &both[0]);
    describe(args[1], &both[1]);
    return PyBytes_FromStringAndSize((const char *)both, sizeof both);
}

/* whether a and b are what ``print`` recorded (the type first: nothing else is read of another) */
static int same(PyObject *print, PyObject *a, PyObject *b)
{
    const Array *kept = (const Array *)PyBytes_AS_STRING(print);
    Array now;
    if (Py_TYPE(a) != kept[0].type || Py_TYPE(b) != kept[1].type)
        return 0;
    describe(a, &now);
    if (memcmp(&now, &kept[0], sizeof now))
        return 0;
    describe(b, &now);
    return !memcmp(&now, &kept[1], sizeof now);
}

static int print_arguments(PyObject *const *args, Py_ssize_t nargs, Py_ssize_t want, int at)
{
    if (nargs != want || !PyBytes_Check(args[0]) || !PyBytes_Check(args[at])
        || PyBytes_GET_SIZE(args[at]) != 2 * (Py_ssize_t)sizeof(Array)) {
        PyErr_SetString(PyExc_TypeError, want == 3 ? "matches(print, a, b)" : "run_if_same(program, print, a, b)");
        return -1;
    }
    return 0;
}

static PyObject *matches(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (print_arguments(args, nargs, 3, 0))
        return NULL;
    return PyBool_FromLong(same(args[0], args[1], args[2]));
}

static PyObject *run_if_same(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (print_arguments(args, nargs, 4, 1))
        return NULL;
    if (!same(args[1], args[2], args[3]))
        Py_RETURN_FALSE;
    if (run_program(args[0], PyArray_DATA((PyArrayObject *)args[2]), PyArray_DATA((PyArrayObject *)args[3]), NULL))
        return NULL;
    Py_RETURN_TRUE;
}

/* copy(target, source): source's bytes into target, two C-contiguous buffers of one item size and
 * shape (the caller sees to their type), by copy_bytes (NumPy's copyto is glibc's memcpy); a
 * BufferError or ValueError otherwise. */
static PyObject *copy(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    Py_buffer to, from;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "copy(target, source): two buffers");
        return NULL;
    }
    if (PyObject_GetBuffer(args[0], &to, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS))
        return NULL;
    if (PyObject_GetBuffer(args[1], &from, PyBUF_C_CONTIGUOUS)) {
        PyBuffer_Release(&to);
        return NULL;
    }
    int alike = to.len == from.len && to.itemsize == from.itemsize && to.ndim == from.ndim;
    for (int d = 0; alike && d < to.ndim; d++)
        alike = to.shape[d] == from.shape[d];
    if (alike)
        copy_bytes(to.buf, from.buf, (size_t)to.len);
    PyBuffer_Release(&from);
    PyBuffer_Release(&to);
    if (!alike) {
        PyErr_SetString(PyExc_ValueError, "copy(target, source): buffers of one item size and shape");
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"copy", (PyCFunction)(void (*)(void))copy, METH_FASTCALL,
     "copy(target, source): a byte copy between two contiguous buffers of one item size and shape"},
    {"run", (PyCFunction)(void (*)(void))run, METH_FASTCALL, "run(program, input, output, partial): one rank's plan"},
    {"run_expecting", (PyCFunction)(void (*)(void))run_expecting, METH_FASTCALL,
     "run_expecting(program, input, output, expected): the plan, then whether the output begins with expected"},
    {"fingerprint", (PyCFunction)(void (*)(void))fingerprint, METH_FASTCALL,
     "fingerprint(a, b): what can change in place of two 1-D NumPy arrays, recorded"},
    {"matches", (PyCFunction)(void (*)(void))matches, METH_FASTCALL, "matches(print, a, b): a and b as recorded"},
    {"run_if_same", (PyCFunction)(void (*)(void))run_if_same, METH_FASTCALL,
     "run_if_same(program, print, a, b): the all-reduce plan on a and b where they are as recorded; whether it ran"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_compiled_engine", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__compiled_engine(void)
{
    main_thread = PyThread_get_thread_ident();
    PyObject *m = PyModule_Create(&module);
    if (m && (PyModule_AddIntConstant(m, "HEADER_WORDS", H_WORDS) || PyModule_AddIntConstant(m, "STEP_WORDS", S_WORDS)
              || PyModule_AddIntConstant(m, "LINE", LINE)
              || PyModule_AddIntConstant(m, "MAX_PENDING", MAX_PENDING))) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
