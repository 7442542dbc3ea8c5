/* prim.h -- the contract between Keel and the operating system.
 *
 * This is the only interface through which Keel's core touches the OS; the core never
 * includes an OS header. Every function here is safe to call from inside malloc: none
 * of them allocates, takes a lock that malloc might hold, or uses stdio.
 * The Linux implementation is prim_linux.c; a port implements this header.
 */
#ifndef KEEL_PRIM_H
#define KEEL_PRIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* -- memory ---------------------------------------------------------------------------
 * Mappings are anonymous, private, readable and writable, committed on first touch.
 * Sizes and addresses are multiples of the OS page size. */

/* Maps `size` bytes aligned to `align` (a power of two >= the page size; the page size
 * itself for no constraint). `hint` is an address to try first, or NULL.
 * Returns NULL on failure (errno is then ENOMEM for the caller to keep). */
void* _keel_prim_map(size_t size, size_t align, void* hint);

/* Reserves `size` bytes of address space that read as zeros and cost no memory until
 * written; parts are made writable with _keel_prim_protect(..., true). NULL on failure
 * (for instance under RLIMIT_AS); errno is left as it was. */
void* _keel_prim_reserve_zero(size_t size);

/* Unmaps a range returned by _keel_prim_map (or a page-aligned part of it). */
void _keel_prim_unmap(void* addr, size_t size);

/* Gives the physical pages of a range back to the OS now; the range stays mapped and
 * reads as zeros afterwards. Returns false if the OS refused. */
bool _keel_prim_purge(void* addr, size_t size);

/* Grows or shrinks a mapping, moving it if `may_move`. Returns the new address or NULL
 * (the old mapping is then untouched). */
void* _keel_prim_remap(void* addr, size_t old_size, size_t new_size, bool may_move);

/* Moves the pages of [from, from + size) to [to, to + size), replacing whatever was
 * mapped there; the pages keep their contents and nothing is copied (the page tables
 * move). False if the OS refused (for instance: the source spans several mappings on a
 * kernel that cannot move those together); nothing has changed then. */
bool _keel_prim_move(void* from, size_t size, void* to);

/* True if _keel_prim_move can move a range made of several mappings (Linux 6.17+);
 * probed once with a few system calls on tiny mappings, then remembered. */
bool _keel_prim_move_spans_mappings(void);

/* Makes a page-aligned range of a mapping inaccessible (`accessible` false: any access
 * faults) or readable and writable again. Returns false if the OS refused (for instance
 * when the process has too many mappings to split one more). */
bool _keel_prim_protect(void* addr, size_t size, bool accessible);

/* Transparent huge page advice for a range: 0 = leave the system default,
 * 1 = ask for huge pages, -1 = refuse them. */
void _keel_prim_thp_advise(void* addr, size_t size, int advice);

/* Backs each whole aligned huge page inside [addr, addr + size) with one huge page now,
 * copying what is resident and zero-filling the rest (Linux 6.1+ MADV_COLLAPSE; the
 * range must not carry the "no huge pages" advice). Slow (a copy, maybe compaction):
 * the background thread's work, never an allocating thread's. False if the OS refused
 * or cannot. */
bool _keel_prim_thp_collapse(void* addr, size_t size);

/* How many OS pages of [addr, addr + size) are in memory (a page-aligned range of one
 * of Keel's mappings, at most 64 MiB); SIZE_MAX if the OS cannot tell. */
size_t _keel_prim_resident_pages(void* addr, size_t size);

/* The machine's transparent huge page setting: 0 never (or none), 1 only where advised
 * (madvise), 2 always. Read once, then remembered. */
int _keel_prim_thp_machine_mode(void);

/* The OS page size, and the transparent huge page size (0 if THP is unavailable). */
size_t _keel_prim_page_size(void);
size_t _keel_prim_huge_page_size(void);

/* Test hook: make the next `count` calls of _keel_prim_map fail (0 disables). */
void _keel_prim_fail_maps(long count);

/* -- time, randomness, identity ------------------------------------------------------ */
uint64_t _keel_prim_clock_ms(void); /* monotonic milliseconds (coarse clock) */
uint64_t _keel_prim_clock_ns(void); /* monotonic nanoseconds (precise: a vDSO call) */
uint64_t _keel_prim_random(void);   /* 64 unpredictable bits; never blocks */
int _keel_prim_getpid(void);

/* -- environment and output ---------------------------------------------------------- */
/* Copies the value of environment variable `name` into buf (NUL-terminated, cut to
 * size - 1 bytes). Returns the value's whole length, which the caller compares with
 * size, or -1 if the variable is not set. Works before libc has set up `environ`. */
long _keel_prim_getenv(const char* name, char* buf, size_t size);

/* Writes all of buf to fd (retrying on short writes and EINTR). */
void _keel_prim_write(int fd, const char* buf, size_t len);

/* Ends the process with SIGABRT after an unrecoverable misuse or internal error. */
_Noreturn void _keel_prim_abort(void);

/* Sets the calling thread's errno. */
void _keel_prim_set_errno(int err);
int _keel_prim_errno_enomem(void);
int _keel_prim_errno_einval(void);

/* -- threads ------------------------------------------------------------------------- */
/* Futex-style waiting on a 32-bit word: sleep while *addr == expected; wake up to n. */
void _keel_prim_futex_wait(volatile uint32_t* addr, uint32_t expected);
/* The same, for at most ms milliseconds. */
void _keel_prim_futex_wait_ms(volatile uint32_t* addr, uint32_t expected, uint64_t ms);
void _keel_prim_futex_wake(volatile uint32_t* addr, int n);
void _keel_prim_yield(void);

/* Registers `on_exit(value)` to run when a thread that called _keel_prim_thread_bind
 * exits. Returns false if the OS has no slot left. Idempotent. */
bool _keel_prim_thread_exit_init(void (*on_exit)(void* value));
/* Arms the exit callback for the calling thread with `value` (NULL disarms). */
void _keel_prim_thread_bind(void* value);

/* Registers fork handlers (like pthread_atfork). */
void _keel_prim_atfork(void (*prepare)(void), void (*parent)(void), void (*child)(void));

/* Starts a detached helper thread running fn(arg). Must not be called with any Keel
 * lock held (thread creation may allocate). Returns false on failure. */
bool _keel_prim_thread_start(void* (*fn)(void*), void* arg);

/* In a forked child (one thread): releases the stack of the helper thread started
 * before the fork, which did not survive it. */
void _keel_prim_thread_forget_after_fork(void);
/* Has every processor that runs one of this process's threads execute a full memory
 * barrier before it returns (membarrier(2), private expedited; registered on first
 * use): a thread's stores made before the call are then visible, and its loads after
 * it see the caller's earlier stores. False where the kernel or a seccomp filter
 * refuses it; then it is never tried again. */
bool _keel_prim_barrier_all_threads(void);
/* Whether _keel_prim_barrier_all_threads was refused for good (it is not tried again). */
bool _keel_prim_barrier_refused(void);
/* Number of threads in this process still running, the caller included (0 if
 * unknown). A main thread that ended with pthread_exit does not count. */
int _keel_prim_thread_count(void);
/* Ends the process as exit(status) does (atexit handlers, destructors, stdio). */
_Noreturn void _keel_prim_exit(int status);

/* Processors this process may run on: the larger of the calling thread's and the main
 * thread's affinity masks (a worker may be pinned to one; 1 if unknown). */
unsigned _keel_prim_cpu_count(void);
/* The processor the calling thread runs on now, read from the rseq area glibc (2.35+)
 * registers, without a system call; where rseq is unavailable, a number fixed per thread
 * (assigned in turn), so that threads still spread. A hint: the thread may move at once. */
unsigned _keel_prim_current_cpu(void);

/* Sleeps the calling thread for `ms` milliseconds. */
void _keel_prim_sleep_ms(uint64_t ms);

/* -- faults -----------------------------------------------------------------------------
 * Installs a handler for SIGSEGV and SIGBUS -- for each only if the program has none of
 * its own at the time of the call (its disposition is the default) -- that runs on the
 * alternate signal stack if the thread has one. For a fault the OS raised at a memory
 * access it calls on_fault(address), in signal context: on_fault must be
 * async-signal-safe (no locks, no allocation, no stdio) and ends the process itself if
 * it recognises the fault. Otherwise the handler restores the default action and
 * returns, so the access faults again and ends the process as it would have without
 * Keel (a signal sent with kill is sent again). Returns true if it installed a handler
 * for at least one of the signals. Call it once. */
bool _keel_prim_fault_handler_install(void (*on_fault)(void* addr));

/* -- stacks and files ------------------------------------------------------------------ */
/* Return addresses of the calling thread's stack, innermost first, skipping `skip`
 * frames; returns how many were stored. Does not allocate. */
int _keel_prim_backtrace(void** out, int max, int skip);
/* The address range of the code of the shared object (or executable) containing
 * `addr`; false if unknown. Used to drop Keel's own frames from stacks. */
bool _keel_prim_code_range(const void* addr, uintptr_t* lo, uintptr_t* hi);
/* Writes "function+0xoff (object)" for a code address into buf; false if unknown. */
bool _keel_prim_symbolize(const void* addr, char* buf, size_t size);
/* Opens `path` for writing (created 0600, truncated); returns a descriptor or -1. */
int _keel_prim_open_write(const char* path);
void _keel_prim_close(int fd); /* (a negative fd is ignored) */
/* Appends the contents of the file `path` to descriptor fd (e.g. /proc/self/maps). */
void _keel_prim_copy_file(const char* path, int fd);

/* -- publishing to other processes --------------------------------------------------- */
/* Creates (replacing a stale one) a shared-memory file readable and writable only by
 * this process's user, named `name` (no slashes) in the OS's shared-memory directory,
 * of `size` bytes, and maps it. Returns NULL on failure. */
void* _keel_prim_publish_create(const char* name, size_t size);
/* Removes the file (the mapping stays valid until unmapped). */
void _keel_prim_publish_remove(const char* name);
/* Removes the files named `prefix` + a process id whose process has ended and that
 * belong to this process's user: a process killed by a signal or ended by _exit never
 * removes its own. */
void _keel_prim_publish_sweep(const char* prefix);

/* -- shared pages and write barriers (meshing: docs/meshing.md, sections 6 and 9) ----- */
/* A memory file that pages of several addresses can map. None of these allocate; all
 * fail cleanly (false or -1) and keep errno. */
/* Creates an anonymous memory file (close-on-exec) of `size` bytes, sparse; returns a
 * descriptor or -1. Reads past what was written return zeros. */
int _keel_prim_file_create(uint64_t size);
/* Writes len bytes at offset off (all of them, or false). */
bool _keel_prim_file_write(int fd, uint64_t off, const void* buf, size_t len);
/* Frees the file's memory in [off, off + len) (reads then return zeros). */
bool _keel_prim_file_release(int fd, uint64_t off, uint64_t len);
/* Bytes of memory the file holds now. */
uint64_t _keel_prim_file_resident(int fd);
/* Replaces [addr, addr + len) with a private, writable view of the file at off: reads
 * see the file page (shared with every other view of it) until this address range
 * writes, which gives it its own copy (copy-on-write, also across fork). Atomic: a
 * concurrent reader sees the old page or the view, never a hole. */
bool _keel_prim_map_view(void* addr, size_t len, int fd, uint64_t off);
/* Replaces [addr, addr + len) with fresh anonymous memory that reads as zeros. */
bool _keel_prim_map_fresh(void* addr, size_t len);
/* Per page of [addr, addr + pages * page size): KEEL_VIEW_ABSENT (never touched, or
 * swapped), KEEL_VIEW_SHARED (maps the file's page), KEEL_VIEW_PRIVATE (a page of its
 * own: anonymous memory, or a view that was written). Returns false if the OS cannot
 * tell. */
enum { KEEL_VIEW_ABSENT = 0, KEEL_VIEW_SHARED = 1, KEEL_VIEW_PRIVATE = 2 };
bool _keel_prim_view_state(const void* addr, size_t pages, uint8_t* out);

/* A write barrier: writes to an armed range wait in the kernel (no signal is involved)
 * until the range is woken; reads go on. KEEL_BARRIER_KERNEL: writes the kernel makes
 * for the process (read(2) into the range) wait too; KEEL_BARRIER_USER: those fail with
 * EFAULT instead, so meshing must not rely on it by default; NONE: not available (no
 * userfaultfd write protection, or not permitted). */
enum { KEEL_BARRIER_NONE = 0, KEEL_BARRIER_USER = 1, KEEL_BARRIER_KERNEL = 2 };
/* Opens a barrier (close-on-exec); returns a descriptor and sets *mode, or -1 and NONE. */
int _keel_prim_barrier_open(int* mode);
/* Arms [addr, addr + len) (anonymous memory, or a view on Linux 5.19+). */
bool _keel_prim_barrier_arm(int barrier, void* addr, size_t len);
/* Wakes the writers waiting on [addr, addr + len): after the range was replaced (their
 * write then goes to the new page), or after _keel_prim_barrier_disarm. */
bool _keel_prim_barrier_wake(int barrier, void* addr, size_t len);
/* Unprotects and unregisters a range that is still armed (an operation given up). */
bool _keel_prim_barrier_disarm(int barrier, void* addr, size_t len);

/* The kernel's limit on a process's mappings (vm.max_map_count; 0 if unknown), and how
 * many this process has now (lines of /proc/self/maps; 0 if unknown). */
uint64_t _keel_prim_map_limit(void);
uint64_t _keel_prim_map_count(void);
/* Whether the process has locked memory (VmLck > 0, e.g. mlockall(MCL_FUTURE)): new
 * mappings are then populated at once, and a private view would be copied at once. */
bool _keel_prim_memory_locked(void);
/* An identity for what descriptor fd refers to (device and inode), 0 if fd is not open:
 * a program that closes descriptors it does not know about (daemons do) may get the
 * number back for a file of its own, which Keel must then not write to. */
uint64_t _keel_prim_fd_identity(int fd);
/* A pipe whose read end sees end-of-file once every copy of the write end is closed:
 * fds[0] read end, fds[1] write end; both non-blocking and close-on-exec. */
bool _keel_prim_pipe(int fds[2]);
/* Up to n bytes from a pipe's read end: how many, 0 at end-of-file, -1 if none now. */
long _keel_prim_pipe_read(int read_fd, void* buf, size_t n);
/* Writes this process's id (an int32_t) on a pipe's write end, if there is room. */
void _keel_prim_pipe_write_pid(int write_fd);
/* Whether process pid exists and maps the file open as fd (its /proc maps say so). */
bool _keel_prim_process_maps(int pid, int fd);

#endif /* KEEL_PRIM_H */
