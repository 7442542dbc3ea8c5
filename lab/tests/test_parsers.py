"""The parsers of the load generators' reports (sysbench, pgbench, redis-benchmark), on
small samples of their output as the versions the suites run print it: no server needed.

The samples follow each tool's report layout (sysbench 1.0.20, pgbench 15, redis-benchmark
7.0 --csv); the numbers are made up, only their place matters.
"""
from __future__ import annotations

import pytest

from keel_lab.suites.mariadb import parse_sysbench
from keel_lab.suites.postgres import parse_pgbench
from keel_lab.suites.redis import parse_benchmark_csv

# sysbench 1.0.20, oltp_read_only ... run (the report after "Threads started!")
SYSBENCH = """\
sysbench 1.0.20 (using system LuaJIT 2.1.0-beta3)

Running the test with following options:
Number of threads: 4
Initializing random number generator from current time


Initializing worker threads...

Threads started!

SQL statistics:
    queries performed:
        read:                            140014
        write:                           0
        other:                           20002
        total:                           160016
    transactions:                        10001  (999.71 per sec.)
    queries:                             160016 (15995.29 per sec.)
    ignored errors:                      3      (0.30 per sec.)
    reconnects:                          1      (0.10 per sec.)

General statistics:
    total time:                          10.0029s
    total number of events:              10001

Latency (ms):
         min:                                    2.03
         avg:                                    4.00
         max:                                   28.45
         95th percentile:                        5.67
         sum:                                40004.32

Threads fairness:
    events (avg/stddev):           2500.2500/12.34
    execution time (avg/stddev):   10.0011/0.00

"""


def test_sysbench_report():
    assert parse_sysbench(SYSBENCH) == {
        "transactions": 10001, "tps": 999.71, "qps": 15995.29, "errors": 3, "reconnects": 1,
        "min_ms": 2.03, "mean_ms": 4.00, "max_ms": 28.45, "p95_ms": 5.67}


def test_sysbench_takes_the_latency_section_only():
    """min:/avg:/max: are read after "Latency (ms):" (the fairness section has avg too),
    and a report without it (sysbench killed early) has no latency keys."""
    head = SYSBENCH.split("Latency (ms):")[0]
    out = parse_sysbench(head + "Threads fairness:\n    events (avg/stddev): 9.0/1.0\n")
    assert out["tps"] == 999.71 and not {"min_ms", "mean_ms", "max_ms", "p95_ms"} & out.keys()
    # --percentile=99 prints another line: no p95 then, the rest still read
    other = parse_sysbench(SYSBENCH.replace("95th percentile", "99th percentile"))
    assert "p95_ms" not in other and other["max_ms"] == 28.45


def test_sysbench_error_output_gives_nothing():
    text = ("sysbench 1.0.20 (using system LuaJIT 2.1.0-beta3)\n\n"
            "FATAL: unable to connect to MySQL server on host '127.0.0.1', port 3306, "
            "aborting...\nFATAL: error 2003: Can't connect to MySQL server\n")
    assert parse_sysbench(text) == {}


# pgbench 15 -S -c 4 -j 4 -T 2 (select only)
PGBENCH_15 = """\
pgbench (15.5 (Debian 15.5-0+deb12u1))
starting vacuum...end.
transaction type: <builtin: select only>
scaling factor: 1
query mode: simple
number of clients: 4
number of threads: 4
maximum number of tries: 1
duration: 2 s
number of transactions actually processed: 45678
number of failed transactions: 0 (0.000%)
latency average = 0.175 ms
latency stddev = 0.050 ms
initial connection time = 5.432 ms
tps = 22839.123456 (without initial connection time)
"""

# pgbench 13 and before: two tps lines, no failed-transaction count
PGBENCH_13 = """\
starting vacuum...end.
transaction type: <builtin: TPC-B (sort of)>
scaling factor: 2
query mode: simple
number of clients: 16
number of threads: 4
duration: 4 s
number of transactions actually processed: 8123
latency average = 7.880 ms
tps = 2030.456 (including connections establishing)
tps = 2041.789 (excluding connections establishing)
"""


def test_pgbench_15_report():
    assert parse_pgbench(PGBENCH_15) == {
        "tps": 22839.123456, "mean_ms": 0.175, "stddev_ms": 0.050, "transactions": 45678,
        "failed": 0}


def test_pgbench_older_report_takes_the_first_tps_line():
    out = parse_pgbench(PGBENCH_13)
    assert out == {"tps": 2030.456, "mean_ms": 7.880, "transactions": 8123}


def test_pgbench_patterns_are_anchored_at_line_starts():
    # the "tps" inside another line (or the progress lines of -P) is not the result
    progress = "progress: 1.0 s, 22000.5 tps, lat 0.180 ms stddev 0.040, 0 failed\n"
    assert parse_pgbench(progress) == {}
    assert parse_pgbench(progress + PGBENCH_15)["tps"] == 22839.123456


# redis-benchmark 7.0 --csv -t set,get,lpush,lpop (-q not given: progress lines end in \r)
REDIS_CSV = (
    '"test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms",'
    '"p99_latency_ms","max_latency_ms"\n'
    'SET: rps=81234.0 (overall: 80512.2) avg_msec=0.330 (overall: 0.333)\r'
    '"SET","84033.61","0.331","0.096","0.311","0.535","0.719","2.231"\n'
    '"GET","89285.71","0.305","0.088","0.295","0.463","0.599","1.567"\n'
    '"LPUSH","86956.52","0.318","0.104","0.303","0.479","0.623","1.903"\n'
    '"LPOP","88495.58","0.310","0.080","0.295","0.471","0.615","5.119"\n'
)


def test_redis_benchmark_csv():
    res = parse_benchmark_csv(REDIS_CSV)
    assert list(res) == ["SET", "GET", "LPUSH", "LPOP"]
    assert res["SET"] == {"rps": 84033.61, "avg_latency_ms": 0.331, "min_latency_ms": 0.096,
                          "p50_latency_ms": 0.311, "p95_latency_ms": 0.535,
                          "p99_latency_ms": 0.719, "max_latency_ms": 2.231}
    assert res["LPOP"]["p99_latency_ms"] == 0.615


@pytest.mark.parametrize("text", [
    "",
    # rows without the header before them are not trusted
    '"SET","84033.61","0.331","0.096","0.311","0.535","0.719","2.231"\n',
    # redis-benchmark's error when the server is gone
    "Could not connect to Redis at 127.0.0.1:6399: Connection refused\n",
])
def test_redis_benchmark_csv_without_results(text):
    assert parse_benchmark_csv(text) == {}


def test_redis_benchmark_csv_odd_rows():
    """A short row is skipped; a field that is not a number is left out of its row."""
    text = REDIS_CSV + '"INCR","123.4"\n' + '"MSET (10 keys)","n/a","1.0","0.5","1.0","1.5","2.0","3.0"\n'
    res = parse_benchmark_csv(text)
    assert "INCR" not in res
    assert res["MSET (10 keys)"] == {"avg_latency_ms": 1.0, "min_latency_ms": 0.5,
                                     "p50_latency_ms": 1.0, "p95_latency_ms": 1.5,
                                     "p99_latency_ms": 2.0, "max_latency_ms": 3.0}
