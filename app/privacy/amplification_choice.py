"""Which record-level amplification a shuffle-DP silo claims (``shuffle.amplification``).

Amplification is the silo's own conclusion from where its batch randomness comes from, never a
request: the run config (written by the server's side) can ask for ``none`` (always granted:
less is claimed) or ``sampling`` (granted only where the batches are secret, below; otherwise the
silo claims ``none`` and says why). ``auto`` (the default) resolves, per silo, to ``sampling``
only where amplification by the silo's batch sampling is real and safe to claim:

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
    if setting == "none":
        return "none", "shuffle.amplification = none (set in the run config)"
    if noise_seed != "os":  # the server can recompute every batch: no sampling is hidden from it, whatever it asks
        return "none", (f"{setting}: none, the batches are drawn from the run seed (privacy.noise-seed = {noise_seed}), "
                        "which the server knows, so their sampling is not secret")
    if setting == "sampling":  # a request the silo grants only because its batches are secret
        return "sampling", "shuffle.amplification = sampling (set in the run config); the batches are secret " \
                           "(privacy.noise-seed = os)"
    if count_on != 1:
        return "none", (f"auto: none, count-on is {count_on} (> 1): amplified requirements of silos of different "
                        "sizes differ too much for one sum")
    return "sampling", "auto: sampling, the batches are secret (privacy.noise-seed = os) and count-on is 1"
