"""One error tree for the whole project, rooted in `TailguardError`.

It lives in the kit, the bottom layer, because every layer raises these classes (the kit's own
UsageError and DuplicateKey included); the core and everything above import it from here.

Expected failures are data (a SignalResult with an error, an ActionOutcome with status "failed"), not
exceptions; these classes are for what cannot go on:

    TailguardError
    ├── ConfigError     a configuration, a policy, a secret or a command line the controller cannot run with
    │   │               (exit 2 with one sentence)
    │   ├── UsageError      (tailguard.controller.kit.cli_args) a command line argument; also a ValueError
    │   └── DuplicateKey    (tailguard.controller.kit.located_yaml) a YAML mapping repeats a key; the policy and
    settings │                       loaders turn it into their own located errors
    ├── InputError      data from outside is not what it must be (a webhook payload, a handover annotation,
    │                   a trace or a history file, a request to the serving lab)
    ├── SourceError     a metrics or change source cannot be built or read (never counted as a breach)
    ├── ActuatorError   an actuator call failed; `transient` says whether a retry may help
    ├── StoreError      the journal or the outbox file cannot be used
    │   └── StoreWriteError a write the store refused (a full disk, a read-only volume): said once, not per try
    └── (tailguard.serving.errors.LabError: the serving lab's own failures, in the serving package, its client)

A class that is also a builtin error keeps that base too (`class SourceConfigError(ConfigError, ValueError)`), so
every `except ValueError` written before the tree existed still catches it.
`tailguard.controller.kit.clock.ShutdownInterrupt` is deliberately NOT in the tree: it is a BaseException, like
KeyboardInterrupt, so that no `except Exception` (nor an `except TailguardError`) swallows a shutdown.

This module imports nothing from the project.
"""

from __future__ import annotations


class TailguardError(Exception):
    """The root of every error the project raises on purpose."""


class ConfigError(TailguardError):
    """The configuration, a policy or a command line is unusable; the message is one clear sentence."""


class InputError(TailguardError):
    """Data from outside (a payload, an annotation, a file) is not what it must be; the message says why."""


class SourceError(TailguardError):
    """A metrics or change source failed (never counted as a breach)."""


class ActuatorError(TailguardError):
    """An actuator could not do what was asked; `transient` failures (timeouts, 5xx) may be retried."""

    transient: bool = False

    def __init__(self, message: str, *, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


class StoreError(TailguardError):
    """A durable store (the journal, an outbox) cannot be used; the message names the file and why."""


class StoreWriteError(StoreError):
    """A durable store refused a write (SQLite's "database or disk is full", a read-only volume): nothing of that
    transaction was kept; the controller says it once and goes on trying (controller/loop/health.py)."""
