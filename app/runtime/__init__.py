"""The Flower-runtime wing: what silofl adds around Flower 1.42's runtime, each module the answer
to one limit of that release. Needed and documented, and the layer most likely to break on the
next Flower release, so it lives here, apart from the library, and ``tests/test_runtime_wing.py``
fails when the installed Flower is not :data:`FLOWER_VERSION` (whoever upgrades Flower re-checks
each workaround below, then moves the pin).

* :mod:`app.runtime.silo_service` and :mod:`app.runtime.silo_protocol`: a SuperNode starts a
  fresh ``flwr-clientapp`` process for every message, so a ClientApp keeps nothing in memory (the
  data, the model, the calibration, PowerSGD's warm start) and pays torch's import every time. The
  operator runs one long-lived silo service per node; the ClientApp (app/client_app.py) forwards
  each message to it over a Unix socket (the protocol: length-prefixed frames, Flower's own
  protobuf serde, no pickle).
* :mod:`app.runtime.executor`: the same limit answered inside Flower's own protocol: a SuperNode
  started with ``--isolation process`` waits for an external SuperExec on its Runtime API; this is
  one, for silofl only, that runs every ClientApp task in one process.
* :mod:`app.runtime.engine_patches`: the simulation engine's fixed 0.1 s poll and its full scan
  of the stored instructions for every node (``vce_api.add_messages_to_queue``,
  ``InMemoryLinkState.get_message_ins``), Ray's ClientApp actors at niceness 15
  (``RAY_worker_niceness``), its 1 s queue wait at the end of a federation
  (``vce_api.Queue``), Ray's runtime-env agent started only to set PYTHONPATH
  (``RayBackend.init_ray``), the engine rebuilt for every job of a sweep (``RayBackend.build`` /
  ``terminate``) and a lost Ray actor that escapes as a crash (``RayBackend.process_message``).
  Each patch checks the release and the code it replaces, and is skipped with a warning otherwise.
* :mod:`app.runtime.local_superlink`: the local simulation SuperLink that ``flwr run`` starts
  detached on fixed ports, shared by every checkout of the machine: this checkout's own ports,
  remembered under its FLWR_HOME, and stopping only its own SuperLinks, by pid.
* :mod:`app.runtime.flwr_run`: ``flwr run .`` walks the whole checkout to build the app bundle and
  exits 0 when the run failed: a staged copy of the app's sources, and ``--stream`` followed until
  the run's own summary.json is written (app.launch decides from it).

Standard library only here: the ClientApp imports this package (for the protocol) in every
Flower process.
"""

#: the Flower release (major.minor) the workarounds of this wing were written against and checked on
FLOWER_VERSION = "1.42"
