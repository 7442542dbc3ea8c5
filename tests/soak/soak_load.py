#!/usr/bin/python3
"""Continuous mixed load against a Redis or MariaDB server, with every value checked.

Cycles until --duration is over; each cycle:
  grow    insert keys with values of 16 B .. 256 KiB (mostly small), 4 writer threads;
  churn   updates that change value sizes (grow/shrink), deletes and re-inserts, reads;
  shrink  delete ~90% of the keys;
  settle  wait --settle seconds (the allocator's purge delay), then record the server's
          RSS next to its live data size (Redis used_memory; MariaDB: data in the MEMORY
          table, whose rows live in malloc'ed blocks);
  verify  read every remaining key back and compare with what was written (values are
          a function of key, version and size, so checksums are recomputed, not stored).
A sampler thread reads the server's VmRSS every second. Writes a JSON report.

Bounds (checked by soak.sh from this report, see there): no error, no lost or wrong
value, RSS after each shrink within a bound of the live data, no growth across cycles.
"""
import argparse
import hashlib
import json
import random
import sys
import threading
import time


def value(key, version, size):
    seed = hashlib.blake2b(b"%s:%d" % (key.encode(), version), digest_size=16).digest()
    return (seed * (size // 16 + 1))[:size]


def pick_size(rng):
    u = rng.random()
    if u < 0.70:
        return rng.randrange(16, 1024)
    if u < 0.95:
        return rng.randrange(1024, 16384)
    if u < 0.995:
        return rng.randrange(16384, 131072)
    return rng.randrange(131072, 262144)


def rss_kib(pid):
    try:
        for line in open("/proc/%d/status" % pid):
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


class Redis:
    def __init__(self, a):
        import redis
        self.r = redis.Redis(host="127.0.0.1", port=a.port, socket_timeout=60)
        self.r.ping()

    def conn(self):
        return self

    def put_many(self, items):  # [(key, bytes)]
        p = self.r.pipeline(transaction=False)
        for k, v in items:
            p.set(k, v)
        p.execute()

    def delete_many(self, keys):
        p = self.r.pipeline(transaction=False)
        for k in keys:
            p.delete(k)
        p.execute()

    def get_many(self, keys):
        p = self.r.pipeline(transaction=False)
        for k in keys:
            p.get(k)
        return p.execute()

    def live_bytes(self):
        return int(self.r.info("memory")["used_memory"])

    def extra(self):
        i = self.r.info("memory")
        return {"used_memory": int(i["used_memory"]), "dbsize": int(self.r.dbsize())}

    def close(self):
        self.r.close()


class MariaDB:
    """Half the keys in an InnoDB table (MEDIUMBLOB), half in a MEMORY table (rows are
    malloc'ed by the server). Reads also run a sort over the blobs (filesort buffers)."""

    def __init__(self, a):
        import pymysql
        self.pymysql = pymysql
        self.a = a
        c = self.connect()
        cur = c.cursor()
        cur.execute("CREATE DATABASE IF NOT EXISTS soak")
        cur.execute("CREATE TABLE IF NOT EXISTS soak.inno (k VARBINARY(64) PRIMARY KEY, v MEDIUMBLOB) ENGINE=InnoDB")
        cur.execute("CREATE TABLE IF NOT EXISTS soak.mem (k VARBINARY(64) PRIMARY KEY, v VARBINARY(3000)) ENGINE=MEMORY")
        c.close()
        self.local = threading.local()

    def connect(self):
        return self.pymysql.connect(unix_socket=self.a.socket, user="root", autocommit=True,
                                    read_timeout=120, write_timeout=120)

    def c(self):
        if not hasattr(self.local, "c"):
            self.local.c = self.connect()
        return self.local.c

    def table(self, k):
        return "soak.mem" if hash(k) & 1 else "soak.inno"

    def put_many(self, items):
        cur = self.c().cursor()
        by = {}
        for k, v in items:
            t = self.table(k)
            if t == "soak.mem":
                v = v[:3000]
            by.setdefault(t, []).append((k, v))
        for t, rows in by.items():
            cur.executemany("REPLACE INTO %s (k, v) VALUES (%%s, %%s)" % t, rows)

    def delete_many(self, keys):
        cur = self.c().cursor()
        for t in ("soak.mem", "soak.inno"):
            ks = [k for k in keys if self.table(k) == t]
            for i in range(0, len(ks), 500):
                part = ks[i:i + 500]
                cur.execute("DELETE FROM %s WHERE k IN (%s)" % (t, ",".join(["%s"] * len(part))), part)

    def get_many(self, keys):
        cur = self.c().cursor()
        got = {}
        for t in ("soak.mem", "soak.inno"):
            ks = [k for k in keys if self.table(k) == t]
            for i in range(0, len(ks), 500):
                part = ks[i:i + 500]
                cur.execute("SELECT k, v FROM %s WHERE k IN (%s) ORDER BY v" % (t, ",".join(["%s"] * len(part))), part)
                for k, v in cur.fetchall():
                    got[k.decode()] = bytes(v)
        return [got.get(k) for k in keys]

    def live_bytes(self):
        cur = self.c().cursor()
        cur.execute("SELECT COALESCE(SUM(data_length + index_length), 0) FROM information_schema.tables "
                    "WHERE table_schema = 'soak' AND engine = 'MEMORY'")
        return int(cur.fetchone()[0])

    def extra(self):
        cur = self.c().cursor()
        cur.execute("SELECT (SELECT COUNT(*) FROM soak.inno), (SELECT COUNT(*) FROM soak.mem), "
                    "(SELECT COALESCE(SUM(LENGTH(v)),0) FROM soak.inno)")
        n1, n2, b1 = cur.fetchone()
        return {"memory_table_bytes": self.live_bytes(), "rows_innodb": int(n1), "rows_memory": int(n2),
                "innodb_value_bytes": int(b1)}

    def close(self):
        pass


def settle(a, pid, near_kib):
    """RSS once the allocator has had time to give memory back: wait --settle seconds
    (longer than the purge delay); if RSS is not yet near the live data (near_kib), keep
    sampling every 0.5 s for up to --settle-max seconds in all, because on a loaded
    machine the purger thread may run late. Memory that never comes back still shows
    (the lowest RSS seen is returned) and fails the checks. Returns (KiB, seconds)."""
    t = time.time()
    time.sleep(a.settle)
    rss = rss_kib(pid)
    while rss is not None and rss > near_kib and time.time() - t < a.settle_max:
        time.sleep(0.5)
        now = rss_kib(pid)
        if now is None:
            break
        rss = min(rss, now)
    return rss, round(time.time() - t, 1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", choices=["redis", "mariadb"], required=True)
    ap.add_argument("--port", type=int)
    ap.add_argument("--socket")
    ap.add_argument("--pid", type=int, required=True, help="server pid (RSS samples)")
    ap.add_argument("--duration", type=float, default=60)
    ap.add_argument("--keys", type=int, default=20000, help="keys inserted per cycle")
    ap.add_argument("--settle", type=float, default=4.0)
    ap.add_argument("--settle-max", type=float, default=12.0,
                    help="on a loaded machine the purger may run late: after --settle, keep "
                         "sampling RSS for up to this long while it is still falling")
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()

    db = Redis(a) if a.server == "redis" else MariaDB(a)
    state = {}  # key -> (version, size), the expected contents
    lock = threading.Lock()
    errors = []
    samples = []  # (t, rss_kib)
    stop = threading.Event()
    t0 = time.time()

    def sampler():
        while not stop.is_set():
            r = rss_kib(a.pid)
            if r is not None:
                samples.append((round(time.time() - t0, 1), r))
            stop.wait(1.0)

    threading.Thread(target=sampler, daemon=True).start()
    base_rss = rss_kib(a.pid)
    base_live = db.live_bytes()

    def near(live_bytes):
        """RSS near the live data: the empty server, twice the live bytes, 16 MiB."""
        return base_rss + 2 * (live_bytes >> 10) + 16384
    cycles = []
    version = [0]
    ops = {"put": 0, "delete": 0, "get": 0, "verified": 0}

    def run_threads(fn, items):
        chunks = [items[i::a.threads] for i in range(a.threads)]
        ts = [threading.Thread(target=fn, args=(c, random.Random(a.seed * 1000 + i + version[0])))
              for i, c in enumerate(chunks)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()

    def writer(keys, rng):
        try:
            batch = []
            for k in keys:
                with lock:
                    version[0] += 1
                    v = version[0]
                size = pick_size(rng)
                batch.append((k, v, size))
                if len(batch) == 100:
                    db.put_many([(k, value(k, v, s)) for k, v, s in batch])
                    with lock:
                        for k2, v2, s2 in batch:
                            state[k2] = (v2, s2)
                        ops["put"] += len(batch)
                    batch = []
            if batch:
                db.put_many([(k, value(k, v, s)) for k, v, s in batch])
                with lock:
                    for k2, v2, s2 in batch:
                        state[k2] = (v2, s2)
                    ops["put"] += len(batch)
        except Exception as e:  # noqa: BLE001 -- any error fails the soak
            errors.append("write: %r" % e)

    def expected(k):
        v, s = state[k]
        b = value(k, v, s)
        return b[:3000] if (a.server == "mariadb" and db.table(k) == "soak.mem") else b

    def verify(keys):
        bad = 0
        for i in range(0, len(keys), 500):
            part = keys[i:i + 500]
            got = db.get_many(part)
            for k, g in zip(part, got):
                if g is None or bytes(g) != expected(k):
                    bad += 1
                    if len(errors) < 20:
                        errors.append("value of %s: %s" % (k, "missing" if g is None else "differs (%d bytes, expected %d)" % (len(g), len(expected(k)))))
        ops["verified"] += len(keys)
        return bad

    cycle = 0
    while time.time() - t0 < a.duration and not errors:
        cycle += 1
        rng = random.Random(a.seed + cycle)
        c = {"cycle": cycle}
        # grow
        new = ["k%d:%d" % (cycle, i) for i in range(a.keys)]
        run_threads(writer, new)
        c["after_grow"] = {"rss_kib": rss_kib(a.pid), "live_bytes": db.live_bytes(), "keys": len(state)}
        # churn: size changes, deletes, re-inserts, reads
        keys = list(state)
        rng.shuffle(keys)
        upd = keys[: len(keys) // 2]
        run_threads(writer, upd)
        dels = keys[len(keys) // 2: len(keys) // 2 + len(keys) // 5]
        db.delete_many(dels)
        for k in dels:
            del state[k]
        ops["delete"] += len(dels)
        run_threads(writer, dels[: len(dels) // 2])
        sample = rng.sample(list(state), min(2000, len(state)))
        c["churn_bad"] = verify(sample)
        ops["get"] += len(sample)
        # shrink: delete 90%
        keys = list(state)
        rng.shuffle(keys)
        gone = keys[: len(keys) * 9 // 10]
        db.delete_many(gone)
        for k in gone:
            del state[k]
        ops["delete"] += len(gone)
        settled_rss, settle_s = settle(a, a.pid, near(db.live_bytes()))
        c["after_shrink"] = {"rss_kib": settled_rss, "live_bytes": db.live_bytes(), "keys": len(state),
                             "extra": db.extra(), "settle_s": settle_s}
        c["verify_bad"] = verify(list(state))
        c["t"] = round(time.time() - t0, 1)
        cycles.append(c)
        print("cycle %d at %.0f s: grow rss %d MiB live %d MiB; after shrink rss %d MiB live %d MiB, %d keys verified, %d bad" % (
            cycle, c["t"], c["after_grow"]["rss_kib"] >> 10, c["after_grow"]["live_bytes"] >> 20,
            c["after_shrink"]["rss_kib"] >> 10, c["after_shrink"]["live_bytes"] >> 20, len(state),
            c["verify_bad"] + c["churn_bad"]), flush=True)

    # end: delete everything, settle, final sample
    try:
        db.delete_many(list(state))
        state.clear()
    except Exception as e:  # noqa: BLE001
        errors.append("final delete: %r" % e)
    settled_rss, settle_s = settle(a, a.pid, near(db.live_bytes()))
    end = {"rss_kib": settled_rss, "live_bytes": db.live_bytes(), "settle_s": settle_s}
    stop.set()
    rss = [r for _, r in samples]
    report = {
        "server": a.server, "duration_s": round(time.time() - t0, 1), "cycles": cycles,
        "baseline": {"rss_kib": base_rss, "live_bytes": base_live}, "end": end,
        "rss_start_kib": rss[0] if rss else None, "rss_peak_kib": max(rss) if rss else None,
        "rss_end_kib": end["rss_kib"], "samples": samples, "ops": ops, "errors": errors,
    }
    json.dump(report, open(a.out, "w"), indent=1)
    print("soak %s: %d cycles, %d errors; RSS start %d MiB, peak %d MiB, end %d MiB; ops %s" % (
        a.server, len(cycles), len(errors), (report["rss_start_kib"] or 0) >> 10,
        (report["rss_peak_kib"] or 0) >> 10, (end["rss_kib"] or 0) >> 10, ops))
    sys.exit(1 if errors else 0)


if __name__ == "__main__":
    main()
