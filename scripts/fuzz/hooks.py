"""Schemathesis hooks for scripts/fuzz-api.

Loaded by `schemathesis run` through SCHEMATHESIS_HOOKS. They do three things:

- steer some requests at what exists (the seeded messages, dead letters,
  subscriptions, streams, groups and consumers of seed.py) and send them with
  one of the daemon's tokens, an unknown token or none, so the fuzzer reaches
  handlers and not only 404s and 401s;
- fingerprint the stored state straight from the database before and after
  every call;
- the check `no_side_effect_of_a_rejected_request`: an answer >= 400 whose
  call changed the fingerprint fails, naming what changed.

Schemathesis must run with one worker: the fingerprints of two calls in
flight at once would see each other's effects.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import sqlite3
from typing import Any

import schemathesis
from schemathesis.core import NOT_SET

BACKEND = os.environ["CFUZZ_BACKEND"]
DATABASE = os.environ["CFUZZ_DATABASE"]
SCHEMA = os.environ.get("CFUZZ_SCHEMA", "")
ADMIN_TOKEN = os.environ["CFUZZ_ADMIN_TOKEN"]
TENANT_TOKEN = os.environ["CFUZZ_TENANT_TOKEN"]
# FUZZ_SELF_TEST=1: every answer counts as a refusal, so the check must fire
# on the first publish, append or retry (it proves the fingerprint sees them).
REFUSED_FROM = 100 if os.environ.get("FUZZ_SELF_TEST") == "1" else 400
with open(os.environ["CFUZZ_SEEDS"], encoding="utf-8") as seeds_file:
    SEEDS: dict[str, Any] = json.load(seeds_file)

# ------------------------------------------------------------------ database


def _connect():
    if BACKEND == "sqlite":
        # Read-only, so the fingerprint never takes the daemon's write lock;
        # used from the thread of each test phase in turn, never two at once.
        connection = sqlite3.connect(
            f"file:{DATABASE}?mode=ro", uri=True, timeout=30, check_same_thread=False
        )
        return connection
    import psycopg

    return psycopg.connect(DATABASE, autocommit=True)


_CONNECTION = None


def _table(name: str) -> str:
    return f'"{SCHEMA}".{name}' if BACKEND == "postgres" else name


def _queries() -> dict[str, str]:
    t = _table
    if BACKEND == "postgres":
        text, group, last = "::text", "grp", "last_major, last_minor"
        entry = pending_entry = "major, minor"
    else:
        text, group, last = "", "group_name", "last_id"
        entry, pending_entry = "id", "entry_id"
    # What only a request can change. Left out on purpose: a delivery's
    # attempts, errors, lease and available/running state, which the
    # daemon's own webhook attempts change in the background (every attempt
    # is refused, then waits a day).
    return {
        "messages": f"SELECT count(*), max(id{text}) FROM {t('messages')}",
        "deliveries": f"SELECT id, state = 'dead' FROM {t('deliveries')} ORDER BY id",
        "receipts": f"SELECT count(*) FROM {t('receipts')}",
        "subscriptions": f"SELECT name, paused FROM {t('subscriptions')} ORDER BY name",
        "discards": f"SELECT count(*) FROM {t('discards')}",
        "subscription_topics": f"SELECT subscription, pattern, since{text}, since_id "
        f"FROM {t('subscription_topics')} ORDER BY subscription, pattern",
        "removed_topics": f"SELECT subscription, pattern, removed_at{text} "
        f"FROM {t('removed_topics')} ORDER BY subscription, pattern, removed_at",
        "stream_entries": f"SELECT tenant, stream, count(*), max(ARRAY[{entry}]) "
        f"FROM {t('stream_entries')} GROUP BY tenant, stream ORDER BY tenant, stream"
        if BACKEND == "postgres"
        else f"SELECT tenant, stream, count(*), max(id) FROM {t('stream_entries')} "
        "GROUP BY tenant, stream ORDER BY tenant, stream",
        "stream_groups": f"SELECT tenant, stream, {group}, {last} FROM {t('stream_groups')} "
        f"ORDER BY tenant, stream, {group}",
        "stream_consumers": f"SELECT tenant, stream, {group}, consumer, seen_at{text} "
        f"FROM {t('stream_consumers')} ORDER BY tenant, stream, {group}, consumer",
        "stream_pending": f"SELECT tenant, stream, {group}, {pending_entry}, consumer, "
        f"delivered_at{text}, deliveries FROM {t('stream_pending')} "
        f"ORDER BY tenant, stream, {group}, {pending_entry}",
    }


QUERIES = _queries()


def fingerprint() -> dict[str, list[tuple]]:
    """The stored state a request could change, table by table."""
    global _CONNECTION
    for attempt in range(2):
        try:
            if _CONNECTION is None:
                _CONNECTION = _connect()
            state = {}
            for name, sql in QUERIES.items():
                state[name] = [tuple(row) for row in _CONNECTION.execute(sql).fetchall()]
            if BACKEND == "sqlite":
                # End the implicit read so the next fingerprint sees new commits.
                _CONNECTION.rollback()
            return state
        except Exception:
            if attempt == 1:
                raise
            try:
                if _CONNECTION is not None:
                    _CONNECTION.close()
            finally:
                _CONNECTION = None
    raise AssertionError("unreachable")


def describe_difference(before: dict[str, list[tuple]], after: dict[str, list[tuple]]) -> str:
    lines = []
    for name in QUERIES:
        old, new = before.get(name, []), after.get(name, [])
        if old == new:
            continue
        gone = [row for row in old if row not in new]
        came = [row for row in new if row not in old]
        lines.append(f"{name}: removed {gone[:5]!r}, added {came[:5]!r}")
    return "; ".join(lines)


# ------------------------------------------------------------------ steering


def _rng(case) -> random.Random:
    """A choice per case that is the same each time the case is sent again."""
    key = repr(
        (
            case.method,
            case.path,
            sorted((case.path_parameters or {}).items()),
            sorted((case.query or {}).items()),
            None if case.body is NOT_SET else json.dumps(case.body, sort_keys=True, default=repr),
        )
    )
    return random.Random(hashlib.sha256(key.encode()).digest())


def _known_path_values(path: str) -> dict[str, list[Any]]:
    if path.startswith("/v1/messages/"):
        ids = SEEDS["message_ids"]
    elif path.startswith("/v1/dead-letters/"):
        ids = [str(i) for i in SEEDS["dead_letter_ids"]]
    else:
        ids = []
    return {
        "id": ids,
        "name": SEEDS["subscriptions"],
        "tenant": SEEDS["tenants"],
        "stream": SEEDS["streams"],
        "group": SEEDS["groups"],
        "consumer": SEEDS["consumers"],
    }


def _steer(case) -> None:
    rng = _rng(case)
    headers = dict(case.headers or {})

    # Whose request: mostly the admin, then tenant acme's token, a token the
    # daemon does not know, or none.
    roll = rng.random()
    if roll < 0.65:
        headers["Authorization"] = f"Bearer {ADMIN_TOKEN}"
    elif roll < 0.9:
        headers["Authorization"] = f"Bearer {TENANT_TOKEN}"
    elif roll < 0.95:
        headers["Authorization"] = "Bearer not-a-configured-token"
    else:
        headers.pop("Authorization", None)

    # State changes without a body (pause, resume, consumer deletion) must
    # still say JSON; most do.
    if case.method.upper() != "GET" and case.body is NOT_SET and rng.random() < 0.9:
        if not any(k.lower() == "content-type" for k in headers):
            headers["Content-Type"] = "application/json"
    case.headers = headers

    # Half the path parameters name something that exists.
    if case.path_parameters:
        known = _known_path_values(case.path)
        parameters = dict(case.path_parameters)
        for key in parameters:
            if known.get(key) and rng.random() < 0.5:
                parameters[key] = rng.choice(known[key])
        case.path_parameters = parameters

    body = case.body
    if isinstance(body, dict):
        # A blocking group read waits at most a moment.
        block = body.get("block_ms")
        if isinstance(block, int) and not isinstance(block, bool) and 200 < block <= 30_000:
            body = {**body, "block_ms": 200}
        # Dead-letter retry and discard: sometimes the ids that exist.
        if case.path in ("/v1/dead-letters/retry", "/v1/dead-letters/discard") and rng.random() < 0.3:
            body = {"ids": list(SEEDS["dead_letter_ids"])}
        # Publishing: sometimes to a topic a subscription receives.
        if case.path == "/v1/messages" and isinstance(body.get("topic"), str) and rng.random() < 0.2:
            body = {**body, "topic": rng.choice(["fuzzseed.hook", "fuzzseed.dead"])}
        if body is not case.body:
            case.body = body


# ------------------------------------------------------------------ hooks

_BEFORE: dict[str, Any] = {}
_LAST: list[Any] = [None, None]  # (response, difference) of the latest call


@schemathesis.hook
def before_call(ctx, case, kwargs):
    _steer(case)
    _BEFORE["state"] = fingerprint()


@schemathesis.hook
def after_call(ctx, case, response):
    before = _BEFORE.pop("state", None)
    difference = ""
    if before is not None and response.status_code >= REFUSED_FROM:
        difference = describe_difference(before, fingerprint())
    _LAST[0], _LAST[1] = response, difference


@schemathesis.check
def no_side_effect_of_a_rejected_request(ctx, response, case):
    """An answer >= 400 stored nothing: the fingerprint is unchanged."""
    if _LAST[0] is response and _LAST[1]:
        raise AssertionError(
            f"{case.method} {case.formatted_path} answered {response.status_code} "
            f"but changed the stored state: {_LAST[1]}"
        )
