"""The Flower-runtime wing (app/runtime/) names the Flower release it was written against, and the
Flower internals its workarounds replace or call still exist. On a Flower upgrade these fail first:
re-check each workaround of app/runtime/__init__.py against the new release, then move
``FLOWER_VERSION``."""

from __future__ import annotations

import importlib
import inspect
from importlib.metadata import version

import pytest

from app.runtime import FLOWER_VERSION


def test_the_installed_flower_is_the_release_the_wing_was_written_against() -> None:
    found = version("flwr")
    assert ".".join(found.split(".")[:2]) == FLOWER_VERSION, (
        f"flwr {found} is installed, but app/runtime/ (silo service, executor, engine patches, local "
        f"SuperLink, flwr run) was written against flwr {FLOWER_VERSION}.x: re-check each workaround "
        "named in app/runtime/__init__.py against the new release, then set FLOWER_VERSION")


def test_the_engine_patches_pin_the_same_release() -> None:
    from app.runtime import engine_patches

    assert engine_patches.PATCHED_FLWR == f"{FLOWER_VERSION}."


def test_the_engine_internals_the_patches_replace_still_hold_the_code_they_replace() -> None:
    """fast_poll: vce_api.add_messages_to_queue's 0.1 s wait; prompt_engine_stop: vce_api.Queue;
    lean_ray_start: RayBackend.init_ray's runtime_env; keep_engine_warm: RayBackend.build and
    terminate; watch_engine_losses: RayBackend.process_message; engine losses: Ray's errors."""
    from app.runtime.engine_patches import ENGINE_LOSS_ERRORS, POLL_WAIT_CALL, RUNTIME_ENV_CALL

    vce_api = importlib.import_module("flwr.server.superlink.fleet.vce.vce_api")
    raybackend = importlib.import_module("flwr.server.superlink.fleet.vce.backend.raybackend")
    # the installed files' text: an earlier test in the session may have patched the attributes
    assert POLL_WAIT_CALL in inspect.getsource(vce_api)
    assert hasattr(vce_api.Queue, "get")
    backend = raybackend.RayBackend
    assert RUNTIME_ENV_CALL in inspect.getsource(raybackend)
    for name in ("build", "terminate", "process_message"):
        assert callable(getattr(backend, name, None)), f"RayBackend.{name} is gone"
    rex = pytest.importorskip("ray.exceptions")
    for name in ENGINE_LOSS_ERRORS + ("RayTaskError",):
        assert isinstance(getattr(rex, name, None), type), f"ray.exceptions.{name} is gone"


@pytest.mark.parametrize("module, names", [
    # the silo protocol: Flower's protobuf serde of a RecordDict
    ("flwr.common.serde", ("recorddict_to_proto", "recorddict_from_proto")),
    ("flwr.proto.recorddict_pb2", ("RecordDict",)),
    ("flwr.common.config", ("parse_config_args",)),
    # the executor: Flower's Runtime API client and flwr-clientapp's own task steps
    ("flwr.supercore.runtime", ("RuntimeHttpClient",)),
    ("flwr.supercore.interceptors", ("RuntimeTokenHttpInterceptor", "RuntimeVersionHttpInterceptor")),
    ("flwr.supercore.retry", ("make_simple_http_retry_invoker",)),
    ("flwr.supercore.heartbeat", ("HeartbeatSender", "make_task_heartbeat_fn_http")),
    ("flwr.supercore.constant", ("TaskType",)),
    ("flwr.proto.runtime_pb2", ("AcquireTaskRequest",)),
    ("flwr.supernode.runtime.run_clientapp", ("pull_task_input", "push_message", "push_task_output")),
    ("flwr.common.constant", ("ErrorCode", "SubStatus")),
])
def test_the_flower_internals_the_wing_calls_still_exist(module: str, names: tuple[str, ...]) -> None:
    mod = importlib.import_module(module)
    missing = [n for n in names if not hasattr(mod, n)]
    assert not missing, f"{module} has no {missing} (app/runtime/ was written against flwr {FLOWER_VERSION})"


def test_flower_still_reads_the_local_superlink_ports_the_launcher_sets() -> None:
    """local_superlink gives each checkout its own local SuperLink through the environment
    variables Flower's CLI reads for its ports, whose defaults it avoids."""
    from app.runtime.local_superlink import FLOWER_LOCAL_PORTS, LOCAL_PORT_ENV

    source = inspect.getsource(importlib.import_module("flwr.cli.constant"))
    for env, port in zip(LOCAL_PORT_ENV, FLOWER_LOCAL_PORTS):
        assert env in source and f'"{port}"' in source, f"flwr.cli.constant no longer reads {env} (default {port})"


def test_the_engine_index_and_actor_niceness_match_the_installed_flower_and_ray() -> None:
    """index_engine_messages: the source of add_messages_to_queue and get_message_ins it was checked
    against; actor_niceness: the environment variable Ray's raylet reads for its workers' niceness."""
    from app.runtime import engine_patches

    vce_api = importlib.import_module("flwr.server.superlink.fleet.vce.vce_api")
    linkstate = importlib.import_module("flwr.server.superlink.linkstate.in_memory_linkstate")
    flower_loop = engine_patches._flower_loop(vce_api)  # Flower's, even if a test of this session patched it
    assert engine_patches._source_sha256(flower_loop) == engine_patches.INDEX_SOURCE_SHA256["add_messages_to_queue"]
    assert (engine_patches._source_sha256(linkstate.InMemoryLinkState.get_message_ins)
            == engine_patches.INDEX_SOURCE_SHA256["InMemoryLinkState.get_message_ins"])
    assert callable(linkstate.InMemoryLinkState._check_stored_messages) and callable(linkstate.now)
    ray_constants = pytest.importorskip("ray._private.ray_constants")
    assert ray_constants.RAY_WORKER_NICENESS == engine_patches.RAY_WORKER_NICENESS_ENV
