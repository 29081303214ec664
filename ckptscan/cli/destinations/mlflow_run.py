"""--mlflow URI (--mlflow-experiment NAME): the new steps' metrics, verdict
tags and the reports, in an MLflow run (a service: a failure is one line on
stderr)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional

from ckptscan.cli.app import note
from ckptscan.cli.destinations.common import Asked
from ckptscan.cli.options import Group, Option
from ckptscan.errors import CkptScanError
from ckptscan.report.destinations import Delivery

MLFLOW: Option[str | None] = Option(
    "mlflow", "--mlflow", Optional[str], None, metavar="URI", help="Log the per-step metrics, verdict tags and the "
    "JSON/HTML report to an MLflow tracking store: http(s)://server, databricks or sqlite:///mlflow.db (one MLflow "
    "run per scanned run; needs pip install 'ckptscan[mlflow]').")
MLFLOW_EXPERIMENT: Option[str] = Option("mlflow_experiment", "--mlflow-experiment", str, "ckptscan", metavar="NAME",
                                        help="The MLflow experiment of --mlflow.")


@dataclass
class MlflowRun(Asked):
    """--mlflow URI: the new steps' metrics, verdict tags and the reports."""

    flag: ClassVar[str] = "--mlflow"
    options = (MLFLOW, MLFLOW_EXPERIMENT)
    uri: str
    experiment: str

    @classmethod
    def asked(cls, given: Group) -> MlflowRun | None:
        uri = given[MLFLOW]
        return None if uri is None else cls(uri, given[MLFLOW_EXPERIMENT])

    def check(self) -> None:
        from ckptscan.report.mlflow import require_mlflow

        require_mlflow()
        check_mlflow_uri(self.uri)

    def write(self, delivery: Delivery) -> None:
        from ckptscan.report.destinations import deliver
        from ckptscan.report.mlflow import write_mlflow

        if (steps := deliver(self.flag, write_mlflow, delivery.report, self.uri, self.experiment)) is not None:
            note(f"mlflow: {steps[0]} new step(s) written to {self.uri} ({self.experiment}), {steps[1]} already "
                 "there", quiet=delivery.quiet)


def check_mlflow_uri(uri: str) -> None:
    """A tracking URI whose scheme MLflow has no store for (a typo, a missing
    plugin) is a usage error, found before the scan."""
    from mlflow.exceptions import MlflowException
    # MLflow's own registry of store schemes, plugins included (no public
    # function answers "is this a tracking URI" without connecting).
    from mlflow.tracking._tracking_service.utils import _tracking_store_registry

    try:
        _tracking_store_registry.get_store_builder(uri)
    except MlflowException:
        raise CkptScanError(f"--mlflow: {uri!r} is not a tracking URI MLflow can use "
                            "(http(s)://HOST, databricks, sqlite:///FILE, a directory)") from None
