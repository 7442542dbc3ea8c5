"""redis_resp.py -- a command in the Redis protocol (RESP), for the test scripts that
write data sets for `redis-cli --pipe` (run them with redis_python from
tests/harness/redis_server.sh, which puts this folder on the module path)."""


def resp(*args):
    """The RESP encoding of one command: each argument as bytes, str or a number."""
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)
