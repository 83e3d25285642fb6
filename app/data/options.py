"""The data options (dataset, partition, pre-processing, silos), declared once (app/options.py)."""

from __future__ import annotations

from dataclasses import dataclass

from app.data.partition import PARTITIONS
from app.data.scaling import PCA_FITS, SCALING_MODES
from app.data.sources import SOURCES
from app.options import choice, number, option


@dataclass(frozen=True)
class DataOptions:
    """The top-level data options of app.config.Settings."""

    dataset: str = option("dataset", choice(SOURCES), "wbcd", "the data source")
    data_dir: str = option("data-dir", choice(), "", "where the data files are (\"\": the source's default)")
    partition: str = option("partition", choice(PARTITIONS), "preset", "how the records are split among silos")
    partition_alpha: float = option("dirichlet-alpha", number(0, None, lo_open=True), 0.5,
                                    "Dirichlet concentration of partition dirichlet")
    partition_p: float = option("mixing-p", number(0, 1), 0.0, "partition mixing: the share drawn from all data")
    #: feature scaling (app/data/scaling.py): auto (public ranges, else DP statistics), public,
    #: server, dp; pooled and local are outside the guarantee (reproducing papers only), none
    standardize: str = option("standardize", choice(SCALING_MODES), "auto", "feature scaling (auto: covered by eps)")
    test_fraction: float = option("test-fraction", number(0, 1, lo_open=True, hi_open=True), 0.2,
                                  "each silo's held-out share")
    #: share of each silo's training split held out for hyper-parameter selection (0 = none)
    validation_fraction: float = option("validation-fraction", number(0, 1, hi_open=True), 0.0,
                                        "share of each silo's training split held out for validation")
    #: project the features on their top principal components (0 = off; fitted on the pooled
    #: training records: non-private pre-processing, like pooled standardisation)
    pca: int = option("pca", number(0, 100_000, integer=True), "preset", "top-d principal components (0: off)")
    #: where the PCA is fitted: "public" (the server's public sample) or "pooled" (all silos'
    #: training records: outside the guarantee, reproducing papers only)
    pca_fit: str = option("pca-fit", choice(PCA_FITS), "public", "where the PCA is fitted: public or pooled")
    #: records of the server's public sample (carved out before the partition, disjoint from every
    #: silo) when pca-fit = "public" with pca > 0, or standardize = "server"; 0: min(500, a tenth)
    public_size: int = option("public-size", number(0, None, integer=True), 0,
                              "records of the server's public sample (0: min(500, a tenth))")
    #: standardize = "dp": the share of each silo's epsilon its pre-processing release spends, and
    #: the L2 norm its records are clipped to (in the features' units after public range scaling)
    preprocess_share: float = option("preprocess-share", number(0, 1, lo_open=True, hi_open=True), 0.1,
                                     "standardize dp: the share of epsilon the pre-processing release spends")
    preprocess_clip: float = option("preprocess-clip", number(0, None, lo_open=True), 1.0,
                                    "standardize dp: the L2 norm records are clipped to")
    #: the schema every silo's own records must match (app/data/schema.py): a JSON/YAML path or
    #: inline JSON; "" = the built-in ``dataset``'s records
    data_schema: str = option("data.schema", choice(), "", "the schema of the silos' own records (docs/your-data.md)")
    #: a simulation's stand-in for the silos' own files: one file split by ``partition``
    data_simulation_file: str = option("data.simulation-file", choice(), "",
                                       "a simulation's own file, split among the virtual silos")
    #: the server's own trust set (Grad-BANT / FLTrust) and test set, read by the ServerApp
    server_trust_file: str = option("server.trust-file", choice(), "", "the server's own trust-set file")
    server_test_file: str = option("server.test-file", choice(), "", "the server's own test-set file")
    num_silos: int = option("num-silos", number(1, 10_000, integer=True), "preset", "N, the number of silos")
    silos_per_round: int = option("silos-per-round", number(1, 10_000, integer=True), "preset",
                                  "M <= N silos sampled each round")


#: node-config keys naming a silo's own records: the run config may not set them
NODE_ONLY_KEYS = ("data-file", "data-format")


def check_own_data(s: DataOptions, error: type[Exception]) -> None:
    """Own records (docs/your-data.md): files need the schema they are checked against, and
    the server's own files cannot share the pooled PCA fitted on the silos' records."""
    named = [k for k, v in (("data.simulation-file", s.data_simulation_file), ("server.trust-file", s.server_trust_file),
                            ("server.test-file", s.server_test_file)) if v]
    if named and not s.data_schema:
        raise error(f"{named[0]} needs data.schema: the schema its records are checked against")
    if s.pca and (s.server_trust_file or s.server_test_file):
        raise error(f"pca = {s.pca} is not allowed with the server's own files (server.trust-file, "
                    "server.test-file): the projection is fitted on the silos' pooled records; allowed: 0")
