"""The lab's operator-facing error, in a module of its own.

SuiteError is raised by the suites and by the modules they use (servers, clients,
procs ...). It lives here, not in keel_lab.suites.base, because importing anything from
the keel_lab.suites package runs its __init__, which imports every suite module, which
imports keel_lab.servers: servers importing suites.base closed an import cycle.
keel_lab.suites.base re-exports it, so `from keel_lab.suites.base import SuiteError`
still works.
"""
from __future__ import annotations


class SuiteError(RuntimeError):
    """A failure with a message meant for the operator."""
