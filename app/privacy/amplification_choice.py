"""Which record-level amplification a shuffle-DP silo claims (``shuffle.amplification``).

``none`` and ``sampling`` are taken as set. ``auto`` (the default) resolves, per silo, to
``sampling`` only where amplification by the silo's batch sampling is real and safe to claim:

* the batch is secret from the server: the silo draws it from the OS CSPRNG
  (``privacy.noise-seed = "os"``, a deployed node's default). With ``"run"`` (simulations) the
  batches derive from the run seed, which the server knows, so no sampling is hidden from it;
* the effective count-on is 1 (every silo carries all the noise its own epsilon needs). With
  count-on > 1 amplified requirements of silos of different sizes differ far more than any
  headroom (docs/results.md: 200x), and the shuffler refuses sums that miss a silo's requirement.

Otherwise ``none``. The result is one of app.privacy.amplification.AMPLIFICATIONS with a one-line reason.
"""

from __future__ import annotations

#: the values of the run-config key shuffle.amplification
AMPLIFICATION_SETTINGS: tuple[str, ...] = ("none", "sampling", "auto")


def resolve_amplification(setting: str, noise_seed: str, count_on: int) -> tuple[str, str]:
    """(amplification, why) for ``shuffle.amplification`` = ``setting``, the silo's
    ``privacy.noise-seed`` and its effective count-on (``shuffle.count-on``, or silos-per-round when 0)."""
    if setting not in AMPLIFICATION_SETTINGS:
        raise ValueError(f"shuffle.amplification must be one of {AMPLIFICATION_SETTINGS}, got {setting!r}")
    if setting != "auto":
        return setting, f"shuffle.amplification = {setting} (set in the run config)"
    if noise_seed != "os":
        return "none", (f"auto: none, the batches are drawn from the run seed (privacy.noise-seed = {noise_seed}), "
                        "which the server knows, so their sampling is not secret")
    if count_on != 1:
        return "none", (f"auto: none, count-on is {count_on} (> 1): amplified requirements of silos of different "
                        "sizes differ too much for one sum")
    return "sampling", "auto: sampling, the batches are secret (privacy.noise-seed = os) and count-on is 1"
