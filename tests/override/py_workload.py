"""Allocation-heavy, deterministic Python workload for Keel's override test.

Prints one line per phase, "<phase> <digest>", computed only from deterministic data,
so a run under LD_PRELOAD=libkeel.so must print exactly what a run under glibc prints.
Run it with PYTHONMALLOC=malloc to send every object allocation to malloc/free/realloc.

Environment:
  OV_MAPS_OUT   if set, a copy of /proc/self/maps is written there while threads run
  OV_SCALE      work multiplier (default 1)
"""
import ctypes
import gc
import hashlib
import json
import math
import os
import queue
import random
import sqlite3
import sys
import threading
import time
import zlib

SCALE = float(os.environ.get("OV_SCALE", "1"))


def n(x):
    return max(1, int(x * SCALE))


def H(*parts):
    h = hashlib.sha256()
    for p in parts:
        if isinstance(p, int):
            p = p.to_bytes((p.bit_length() + 8) // 8 or 1, "little", signed=True)
        elif isinstance(p, str):
            p = p.encode()
        h.update(p)
        h.update(b"|")
    return h.hexdigest()[:32]


def out(phase, digest):
    print(f"{phase} {digest}", flush=True)


# --- dicts, lists, strings -------------------------------------------------------
def dict_churn(seed, rounds):
    rng = random.Random(seed)
    acc = 0
    d = {}
    for r in range(rounds):
        for i in range(2000):
            k = f"k{rng.randrange(5000)}:{r % 7}"
            v = d.get(k)
            if v is None:
                d[k] = [i, str(i) * (i % 13), (r, i)]
            else:
                v.append(i)
                if len(v) > 20:
                    del d[k]
        # rebuild into a fresh dict (mass allocate, then mass free the old one)
        d = {k: v[:] for k, v in d.items() if len(v) % 3 != 1}
        acc = (acc * 31 + len(d) + sum(len(v) for v in d.values())) % (1 << 61)
    items = sorted((k, len(v)) for k, v in d.items())
    return H(acc, json.dumps(items))


def string_churn(seed, rounds):
    rng = random.Random(seed)
    parts = []
    total = hashlib.sha256()
    for r in range(rounds):
        s = "".join(chr(97 + rng.randrange(26)) * rng.randrange(1, 40) for _ in range(300))
        parts.append(s.upper()[::-1])
        b = s.encode()
        # bytes += (realloc in place when the refcount is 1)
        grow = b""
        for i in range(200):
            grow += b[i:i + 50]
        total.update(grow)
        total.update(("%d-%s-%r" % (r, s[:10], (r, s[-5:]))).encode())
        if len(parts) > 50:
            total.update("".join(parts).encode())
            parts = parts[25:]
    words = " ".join(parts).split()
    words.sort()
    total.update(" ".join(words[:1000]).encode())
    return total.hexdigest()[:32]


def list_churn(rounds):
    acc = 0
    for r in range(rounds):
        lst = []
        for i in range(20000):
            lst.append(i * r)
        lst2 = [x ^ 0x5A5A for x in lst if x % 3]
        lst2.sort(key=lambda x: (x % 1000, x))
        tup = tuple(lst2[::7])
        acc = (acc + sum(tup) + len(lst2)) % (1 << 61)
        del lst[::2]
        lst.extend(range(5000))
        lst.insert(0, r)
        acc ^= len(lst)
    return H(acc)


# --- bignums ---------------------------------------------------------------------
def bignum_churn(rounds):
    acc = 1
    for r in range(rounds):
        a = math.factorial(1500 + r * 37)
        b = pow(3, 20000 + r * 101) + r
        c = a * b  # Karatsuba temporaries
        q, m = divmod(c, b - 7)
        acc = (acc * 1000003 + (q ^ m) % (1 << 127)) % (1 << 521) - 1
        h = hex(c)  # big string conversion
        acc ^= len(h) + int(h[-30:], 16)
        x = 1
        for i in range(1, 300):
            x = x * (i * i + 1) + (x >> 17)
        acc += x % (10 ** 30)
    return H(acc)


# --- large blocks (realloc growth, huge allocations) -----------------------------
def large_blocks():
    h = hashlib.sha256()
    ba = bytearray()
    for i in range(n(200)):
        ba.extend(bytes([i & 255]) * (16384 + i * 97))  # grows to ~4 MiB+ via realloc
    h.update(ba[::4097])
    blobs = []
    for sz in (1 << 20, 3 << 20, (8 << 20) + 17, 33 << 20, (1 << 20) - 1):
        blob = bytearray(sz)
        blob[0] = 1
        blob[-1] = 2
        blob[sz // 2] = 3
        blobs.append(blob)
        h.update(bytes(blob[sz // 2 - 8:sz // 2 + 8]))
    for blob in blobs:
        del blob[len(blob) // 2:]  # shrink via realloc
        h.update(len(blob).to_bytes(8, "little"))
        h.update(bytes(blob[-4:]))
    del blobs
    z = zlib.compress(bytes(ba), 6)
    h.update(z)
    h.update(zlib.decompress(z)[-1000:])
    return h.hexdigest()[:32]


# --- C library users of malloc: sqlite3 (GIL released inside), json ---------------
def sqlite_work(seed, rows):
    rng = random.Random(seed)
    con = sqlite3.connect(":memory:")
    con.execute("create table t(id integer primary key, k text, v blob, n real)")
    con.executemany("insert into t(k, v, n) values (?, ?, ?)",
                    ((f"key{rng.randrange(rows)}", bytes(rng.randrange(200)),
                      rng.random()) for _ in range(rows)))
    con.execute("create index tk on t(k)")
    r1 = con.execute("select count(*), count(distinct k), sum(length(v)) from t").fetchone()
    r2 = con.execute("select k, count(*), sum(length(v)) from t group by k "
                     "order by 2 desc, 1 limit 20").fetchall()
    con.execute("delete from t where id % 3 = 0")
    con.commit()
    con.execute("vacuum")
    r3 = con.execute("select group_concat(k, ',') from (select k from t order by k limit 500)").fetchone()
    con.close()
    return H(json.dumps([r1, r2, r3]))


# --- threads: producer/consumer (blocks freed by another thread) -----------------
def producer(q, seed, count):
    rng = random.Random(seed)
    for i in range(count):
        kind = i % 4
        if kind == 0:
            item = {"i": i, "s": "x" * rng.randrange(1, 3000), "l": list(range(rng.randrange(50)))}
        elif kind == 1:
            item = bytes(rng.randrange(1, 70000))
        elif kind == 2:
            item = [str(j) for j in range(rng.randrange(1, 200))]
        else:
            item = 7 ** rng.randrange(100, 3000)
        q.put(item)
    q.put(None)


def consume(item):
    if isinstance(item, dict):
        return H(item["i"], item["s"], len(item["l"]))
    if isinstance(item, bytes):
        return H(len(item))
    if isinstance(item, list):
        return H(",".join(item))
    return H(item % (1 << 64))


def thread_phase():
    results = {}
    errors = []

    def run_pair(idx):
        try:
            q = queue.Queue(maxsize=64)
            t = threading.Thread(target=producer, args=(q, 1000 + idx, n(3000)))
            t.start()
            h = hashlib.sha256()
            while True:
                item = q.get()
                if item is None:
                    break
                h.update(consume(item).encode())
                del item  # freed here, allocated in the producer thread
            t.join()
            results[f"pair{idx}"] = h.hexdigest()[:32]
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(repr(e))

    def run_sqlite(idx):
        try:
            results[f"sqlite{idx}"] = sqlite_work(2000 + idx, n(20000))
        except BaseException as e:
            errors.append(repr(e))

    def run_dicts(idx):
        try:
            results[f"dict{idx}"] = dict_churn(3000 + idx, n(40))
        except BaseException as e:
            errors.append(repr(e))

    threads = [threading.Thread(target=run_pair, args=(i,)) for i in range(3)]
    threads += [threading.Thread(target=run_sqlite, args=(i,)) for i in range(2)]
    threads += [threading.Thread(target=run_dicts, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    maps_out = os.environ.get("OV_MAPS_OUT")
    if maps_out:
        with open("/proc/self/maps") as f, open(maps_out, "w") as g:
            g.write(f.read())
    # fork while the other threads are allocating (sqlite mallocs with the GIL
    # released): the allocator must leave the child usable.
    forks = fork_while_busy(threads)
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError("thread errors: " + "; ".join(errors))
    return H(json.dumps(sorted(results.items()))), forks


def child_work(i):
    acc = 0
    d = {}
    for j in range(3000):
        d[str(j)] = [j] * (j % 17)
        if j % 5 == 0:
            d.pop(str(j // 2), None)
    acc = sum(len(v) for v in d.values()) + len(bytes(100000 + i))
    return acc


def fork_while_busy(threads):
    expected = [child_work(i) for i in range(8)]
    ok = 0
    for i in range(8):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(r)
                v = child_work(i)
                os.write(w, str(v).encode())
                os._exit(0)
            except BaseException:
                os._exit(3)
        os.close(w)
        deadline = time.monotonic() + 20
        while True:
            wpid, status = os.waitpid(pid, os.WNOHANG)
            if wpid:
                break
            if time.monotonic() > deadline:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                raise RuntimeError(f"forked child {i} hung (allocator not fork-safe?)")
            time.sleep(0.01)
        data = os.read(r, 100)
        os.close(r)
        if status != 0 or int(data or b"-1") != expected[i]:
            raise RuntimeError(f"forked child {i}: status {status}, result {data!r}, "
                               f"expected {expected[i]}")
        ok += 1
        time.sleep(0.05)
    return ok


# --- the malloc API itself through ctypes (resolves to the preloaded library) ----
def c_api():
    libc = ctypes.CDLL(None)
    vp, sz = ctypes.c_void_p, ctypes.c_size_t
    libc.malloc.restype = vp
    libc.malloc.argtypes = [sz]
    libc.calloc.restype = vp
    libc.calloc.argtypes = [sz, sz]
    libc.realloc.restype = vp
    libc.realloc.argtypes = [vp, sz]
    libc.free.argtypes = [vp]
    libc.free.restype = None
    libc.posix_memalign.argtypes = [ctypes.POINTER(vp), sz, sz]
    libc.aligned_alloc.restype = vp
    libc.aligned_alloc.argtypes = [sz, sz]
    libc.memalign.restype = vp
    libc.memalign.argtypes = [sz, sz]
    libc.malloc_usable_size.restype = sz
    libc.malloc_usable_size.argtypes = [vp]
    problems = []
    for size in (0, 1, 8, 15, 16, 100, 1000, 4096, 40000, 300000, 5 << 20):
        p = libc.malloc(size)
        if not p and size:
            problems.append(f"malloc({size}) = NULL")
            continue
        if p and size and libc.malloc_usable_size(p) < size:
            problems.append(f"malloc_usable_size(malloc({size})) < {size}")
        # fundamental alignment, but a block smaller than 16 only needs what fits in it
        need = min(16, 1 << (size.bit_length() - 1)) if size else 1
        if p and p % need:
            problems.append(f"malloc({size}) = {p:#x}, not {need}-aligned")
        if size:
            ctypes.memset(p, 0xAB, size)
            q = libc.realloc(p, size * 3 + 1)
            if not q or ctypes.string_at(q, size) != b"\xab" * size:
                problems.append(f"realloc lost data ({size} -> {size * 3 + 1})")
            p = q
        libc.free(p)
        c = libc.calloc(size or 1, 3)
        if ctypes.string_at(c, (size or 1) * 3) != bytes((size or 1) * 3):
            problems.append(f"calloc({size}, 3) not zeroed")
        libc.free(c)
    for align in (16, 32, 64, 256, 4096, 65536, 1 << 21):
        for size in (1, align - 1, align, 3 * align + 5):
            out_p = vp()
            rc = libc.posix_memalign(ctypes.byref(out_p), align, size)
            if rc or not out_p.value or out_p.value % align:
                problems.append(f"posix_memalign({align}, {size}) rc={rc}")
            else:
                ctypes.memset(out_p.value, 1, size)
                libc.free(out_p.value)
            a = libc.aligned_alloc(align, size)
            if not a or a % align:
                problems.append(f"aligned_alloc({align}, {size})")
            libc.free(a)
            m = libc.memalign(align, size)
            if not m or m % align:
                problems.append(f"memalign({align}, {size})")
            libc.free(m)
    libc.free(None)
    if problems:
        raise RuntimeError("malloc API problems: " + "; ".join(problems))
    return "ok"


def cycles():
    class Node:
        def __init__(self, i):
            self.i = i
            self.peer = None
            self.payload = [i] * (i % 50)

    total = 0
    for r in range(n(20)):
        nodes = [Node(i) for i in range(5000)]
        for a, b in zip(nodes, nodes[1:] + nodes[:1]):
            a.peer = b
        total += sum(x.peer.i for x in nodes[::97])
        del nodes
        gc.collect()
    return H(total)


def main():
    sys.setrecursionlimit(10000)
    out("api", c_api())
    out("dicts", dict_churn(1, n(60)))
    out("strings", string_churn(2, n(400)))
    out("lists", list_churn(n(60)))
    out("bignums", bignum_churn(n(25)))
    out("large", large_blocks())
    out("cycles", cycles())
    out("json", H(json.dumps(json.loads(json.dumps(
        {str(i): [i, {"a": "b" * (i % 100)}, [None] * (i % 7)] for i in range(n(20000))},
        sort_keys=True)), sort_keys=True)))
    digest, forks = thread_phase()
    out("threads", digest)
    out("forks", forks)
    print("done", flush=True)


if __name__ == "__main__":
    main()
