#!/usr/bin/env python3
"""Writes the seed inputs of tests/fuzz/corpus (deterministic; run again to rebuild).

An input is a sequence of steps: opcode byte, slot byte, then the operation's arguments
(see LLVMFuzzerTestOneInput in fuzz_keel.c). Sizes are a tier byte and 4 bytes."""
import os
import random
import struct
import sys

OP = dict(malloc=0, calloc=2, realloc=3, reallocarray=5, posix_memalign=6, aligned_alloc=8,
          memalign=9, valloc=10, free=11, usable=13, handover=14, helper=15, helper_exit=16,
          flush=17, inject=18, check=19)


def size(tier, r):
    return bytes([tier]) + struct.pack("<I", r)


def step(op, slot, *args):
    return bytes([OP[op], slot]) + b"".join(args)


def seeds(rng):
    out = {}
    # every tier, freed in another order
    s = b""
    for i, tier in enumerate([0, 50, 120, 180, 210, 235, 245, 250, 253]):
        s += step("malloc", i, size(tier, rng.getrandbits(32)))
    for i in reversed(range(9)):
        s += step("free", i)
    out["tiers"] = s
    # realloc chains across tiers
    s = b""
    for tier in [0, 100, 170, 220, 236, 10, 239, 0]:
        s += step("realloc", 1, size(tier, rng.getrandbits(32)))
    out["realloc_chain"] = s
    # aligned allocations of every kind
    s = b""
    for i in range(32):
        op = ["posix_memalign", "aligned_alloc", "memalign"][i % 3]
        s += step(op, i, bytes([i]), size(rng.choice([0, 120, 220, 236]), rng.getrandbits(32)))
    s += step("valloc", 40, size(50, 5000), b"\x00") + step("valloc", 41, size(50, 5000), b"\x01")
    out["aligned"] = s
    # calloc and reallocarray (with overflow)
    s = step("calloc", 3, size(20, 77), b"\x05") + step("calloc", 4, size(225, 9), b"\x02")
    s += step("reallocarray", 3, size(10, 100), b"\x01\x02") + step("reallocarray", 5, size(10, 100), b"\xff")
    out["calloc"] = s
    # cross-thread frees and helper allocations, helper exit
    s = b""
    for i in range(20):
        s += step("malloc", i, size(rng.choice([0, 0, 130, 215]), rng.getrandbits(32)))
        s += step("handover", i)
    s += step("helper", 0, b"\x07" + b"".join(struct.pack("<I", rng.getrandbits(32)) for _ in range(7)))
    s += step("helper_exit", 0)
    s += step("helper", 30, b"\x03" + b"".join(struct.pack("<I", rng.getrandbits(32)) for _ in range(3)))
    out["cross_thread"] = s
    # failing mmaps
    s = step("flush", 0, b"\x01")  # purge: the next big blocks need the OS
    s += step("inject", 0, b"\x08\x03")
    for i in range(8):
        s += step("malloc", i, size(rng.choice([210, 236, 240]), rng.getrandbits(32)))
    for i in range(8):
        s += step("malloc", i + 8, size(236, rng.getrandbits(32)))
    out["inject"] = s
    # random soups
    for k in range(6):
        out["random%d" % k] = bytes(rng.getrandbits(8) for _ in range(rng.randrange(64, 1024)))
    return out


def main():
    d = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "corpus")
    os.makedirs(d, exist_ok=True)
    for name, data in seeds(random.Random(4)).items():
        with open(os.path.join(d, "seed-" + name), "wb") as f:
            f.write(data)
    print("wrote", len(os.listdir(d)), "files to", d)


if __name__ == "__main__":
    main()
