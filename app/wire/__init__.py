"""The typed wire: every message between the server and a silo, and its Flower records.

Messages are dataclasses with ``encode()`` (to a Flower ``RecordDict``) and ``decode()`` (from
one, validated): :class:`Instruction` (server -> silo, train), :class:`TrainReply` and
:class:`Refusal` (silo -> server), :class:`EvaluateRequest` / :class:`EvaluateReply`, the ledger
report and the identity answer. Record and field names live only in this package. Decoding checks
format (keys, types, shapes, finiteness); what a reply's values may be (bounds, identity,
duplicates) is checked by the server's reply validation (strategies/replies.py).

This is the only base-layer package that imports Flower. Everything that arrives from the
network is validated here: a malformed message raises :class:`ReplyError` (the strategy then
drops that silo for the round; a silo answers with a refusal), never anything else. The
low-level helpers (:func:`instruction`, :func:`refusal_of`, the record names) stay public so
tests can build and inspect hostile messages.

Modules: :mod:`app.wire.records` (record and field names, refusal codes, the array codec),
:mod:`app.wire.messages` (the typed messages of a round), :mod:`app.wire.queries` (the ledger,
identity and keys queries and the shuffle-DP messages), :mod:`app.wire.secagg` (secure aggregation). This module is the public API:
``from app import wire`` and ``wire.X``.
"""

from __future__ import annotations

from app.algorithms.base import Phase
from app.wire.messages import (EVALUATION_PREFIX, WITNESS, EvaluateReply, EvaluateRequest, Instruction, Refusal,
                               ShuffleTicket, TrainReply, evaluation_of, read_instruction, with_evaluation,
                               with_secagg, with_witnesses, witnesses_of)
from app.wire.queries import (IDENTITY, IDENTITY_QUERY, KEYS, KEYS_QUERY, LEDGER, LEDGER_QUERY, MAX_SEALED_BYTES,
                              ROLE_SHUFFLER, ROLE_SILO, SEALED, SHUFFLE, SHUFFLE_QUERY, SealedReply, ShuffleReply,
                              ShuffleRequest, identity_reply, keys_reply, ledger_reply, read_identity, read_keys,
                              read_ledger, shuffle_context)
from app.wire.secagg import (SECAGG_KEYS_QUERY, SECAGG_SHARE_QUERY, SECAGG_UNMASK_QUERY, BlobReply, MaskedReply,
                             SecAggParams, ShareReply, ShareRequest, UnmaskRequest, advert_reply, advert_terms, shares_of,
                             shares_record, vector_dtype)
from app.wire.records import (ARRAYS, CONFIG, EPS_SPENT, EVALUATE_ROUND, EXCHANGE, LOCAL_STEPS, LOSS, LR, METRICS,
                              NUMPY_STYPE, PHASE, PREV_ARRAYS, REFUSED_BUDGET, REFUSED_CONFIG, REFUSED_DATA,
                              REFUSED_INTERNAL, REFUSED_LEDGER, REFUSED_NON_FINITE, REFUSED_POLICY, ROUND, SHUFFLER_KEY,
                              SKETCH, SKETCH_FIELDS, STATUS, TRAIN_GRADIENT, UPDATE, Layout, NonFiniteReply, ReplyError,
                              instruction, metrics_reply, params_to_record, read_metrics, read_update, record_of,
                              record_to_params, refusal_of, refusal_reply, unflatten, update_reply)

__all__ = [
    # records
    "ARRAYS", "CONFIG", "EPS_SPENT", "EVALUATE_ROUND", "EXCHANGE", "LOCAL_STEPS", "LOSS", "LR", "METRICS",
    "NUMPY_STYPE", "PHASE", "PREV_ARRAYS", "REFUSED_BUDGET", "REFUSED_CONFIG", "REFUSED_DATA", "REFUSED_INTERNAL",
    "REFUSED_LEDGER", "REFUSED_NON_FINITE", "REFUSED_POLICY", "ROUND", "SHUFFLER_KEY", "SKETCH", "SKETCH_FIELDS",
    "STATUS", "TRAIN_GRADIENT", "UPDATE", "Layout", "NonFiniteReply", "ReplyError", "instruction", "metrics_reply",
    "params_to_record", "read_metrics", "read_update", "record_of", "record_to_params", "refusal_of", "refusal_reply",
    "unflatten", "update_reply",
    # the phase an instruction names
    "Phase",
    # messages
    "EVALUATION_PREFIX", "WITNESS", "EvaluateReply", "EvaluateRequest", "Instruction", "Refusal", "ShuffleTicket",
    "TrainReply", "evaluation_of", "read_instruction", "with_evaluation", "with_secagg", "with_witnesses",
    "witnesses_of",
    # queries
    "IDENTITY", "IDENTITY_QUERY", "KEYS", "KEYS_QUERY", "LEDGER", "LEDGER_QUERY", "MAX_SEALED_BYTES",
    "ROLE_SHUFFLER", "ROLE_SILO", "SEALED", "SHUFFLE", "SHUFFLE_QUERY", "SealedReply", "ShuffleReply",
    "ShuffleRequest", "identity_reply", "keys_reply", "ledger_reply", "read_identity", "read_keys", "read_ledger",
    "shuffle_context",
    # secure aggregation (privacy.mode secagg)
    "SECAGG_KEYS_QUERY", "SECAGG_SHARE_QUERY", "SECAGG_UNMASK_QUERY", "BlobReply", "MaskedReply", "SecAggParams",
    "ShareReply", "ShareRequest", "UnmaskRequest", "advert_reply", "advert_terms", "shares_of", "shares_record",
    "vector_dtype",
]
