"""Sealed request ids and the feedback they carry, outside vLLM: what an id shows (the adapter
only), who can open or mint one (the replicas' feedback key, not the admin key), its expiry,
and feedback counted once per id on a replica and once across replicas where the evaluation
sums them."""

from __future__ import annotations

import json

from loragate_resolver import request_ids, routing

from loragate.registry.rules.live import LiveStats
from tests.support.split import (
    FEEDBACK_KEY,
    KEY,
    NAME,
    FakeVllm,
    _split,
    ask,
    call,
    window,
)


def test_a_request_id_opens_under_the_key_and_names_what_answered():
    rid = request_ids.sign(FEEDBACK_KEY, NAME, "v1", 4)
    found = request_ids.verify(FEEDBACK_KEY, rid)
    assert found is not None and (found.adapter, found.version, found.window) == (NAME, "v1", 4)
    assert request_ids.verify(FEEDBACK_KEY, request_ids.sign(FEEDBACK_KEY, NAME, "base", None)).window is None
    assert request_ids.adapter_of(rid) == NAME


def test_a_request_id_shows_nothing_but_the_adapter_it_was_asked_for():
    import base64

    rid = request_ids.sign(FEEDBACK_KEY, NAME, "v1-secret-version", 123456)
    sealed = base64.urlsafe_b64decode(rid.split(".")[1] + "==")
    assert b"123456" not in sealed and b"v1-secret-version" not in sealed and b'"w"' not in sealed
    # two ids for the same answer share nothing but the adapter
    again = request_ids.sign(FEEDBACK_KEY, NAME, "v1-secret-version", 123456)
    assert rid.split(".")[0] == again.split(".")[0] and rid.split(".")[1][:16] != again.split(".")[1][:16]


def test_a_tampered_foreign_or_admin_keyed_request_id_does_not_open():
    rid = request_ids.sign(FEEDBACK_KEY, NAME, "v1", 4)
    adapter, sealed = rid.split(".")
    other_adapter = request_ids.sign(FEEDBACK_KEY, "acme/tiny-llama/other", "v1", 4).split(".")[0]
    flipped = sealed[:-3] + ("A" if sealed[-3] != "A" else "B") + sealed[-2:]
    for bad in (f"{other_adapter}.{sealed}", f"{adapter}.{flipped}", adapter, "", None, 7, f"{rid}.x"):
        assert request_ids.verify(FEEDBACK_KEY, bad) is None
    assert request_ids.verify(KEY, rid) is None  # the admin key opens nothing
    assert request_ids.verify(None, rid) is None


def test_a_request_id_expires_after_its_ttl():
    issued = 1_000_000.0
    found = request_ids.verify(FEEDBACK_KEY, request_ids.sign(FEEDBACK_KEY, NAME, "v1", 4, now=issued))
    assert not request_ids.expired(found, 3600, now=issued + 3600)
    assert request_ids.expired(found, 3600, now=issued + 3601)
    assert request_ids.expired(found, 3600, now=issued - 120)  # from the future: not ours


def test_feedback_is_counted_once_per_id_and_a_forged_id_is_refused(split_env):
    split = _split(FakeVllm(), routing.Route(NAME, "p1"))
    rid = ask(split)[1][b"x-loragate-request-id"].decode()
    first = call(split, path="/loragate/feedback", body={"request_id": rid, "outcome": "accepted"})
    again = call(split, path="/loragate/feedback", body={"request_id": rid, "outcome": "accepted"})
    assert (first[0], json.loads(first[2])) == (200, {"counted": True, "adapter": NAME, "version": "p1"})
    assert json.loads(again[2])["counted"] is False
    forged = request_ids.sign("not-the-key", NAME, "p1", None)
    assert call(split, path="/loragate/feedback", body={"request_id": forged, "outcome": "accepted"})[0] == 400
    admin_keyed = request_ids.sign(KEY, NAME, "p1", None)  # the key three pools hold seals nothing
    assert call(split, path="/loragate/feedback", body={"request_id": admin_keyed, "outcome": "accepted"})[0] == 400
    assert call(split, path="/loragate/feedback", body={"request_id": rid, "outcome": "loved"})[0] == 400
    assert split.stats.of(NAME, "p1", None).accepted == 1


def test_an_expired_request_id_is_refused_and_counts_nothing(split_env):
    split = _split(FakeVllm(), routing.Route(NAME, "p1"))
    old = request_ids.sign(FEEDBACK_KEY, NAME, "p1", None, now=1_000_000.0)
    status, _, body = call(split, path="/loragate/feedback", body={"request_id": old, "outcome": "retried"})
    assert status == 400 and json.loads(body)["error"]["param"] == "request_id"
    assert split.stats.of(NAME, "p1", None).retried == 0


def test_feedback_sent_to_every_replica_is_counted_once_where_the_evaluation_sums_them(split_env):
    answering = _split(FakeVllm(), window(9, "c1", 1.0))
    rid = ask(answering)[1][b"x-loragate-request-id"].decode()
    replicas = [_split(FakeVllm(), window(9, "c1", 1.0)) for _ in range(3)]
    for replica in replicas:  # a client replaying its feedback to each replica behind the balancer
        for outcome in ("retried", "retried"):
            assert call(replica, path="/loragate/feedback", body={"request_id": rid, "outcome": outcome})[0] == 200
    documents = [{**r.figures(), "replica": f"r{i}"} for i, r in enumerate(replicas)]
    live = LiveStats.from_replicas(documents, NAME, 9, "c1", "p1")
    assert (live.canary.accepted, live.canary.retried) == (0, 1)
