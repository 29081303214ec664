"""S3, GCS and Azure through obstore (Rust `object_store`).

Credentials and endpoint come from the client's standard chain: environment
(`AWS_ACCESS_KEY_ID`…, `AWS_ENDPOINT_URL` for an S3-compatible endpoint, as
boto3 and the AWS CLI read it; `GOOGLE_APPLICATION_CREDENTIALS`, and
`STORAGE_EMULATOR_HOST` for a GCS emulator, as Google's client libraries read
it; `AZURE_STORAGE_ACCOUNT_NAME`…, or `AZURE_STORAGE_CONNECTION_STRING` as the
Azure SDKs and CLI read it), web identity and instance or container
metadata. A named AWS profile (`AWS_PROFILE`, ~/.aws) is read through boto3
when boto3 is installed, as the AWS CLI would. Only GET, HEAD and LIST are
ever sent.
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ckptscan.errors import CkptScanError
from ckptscan.storage.errors import Denied, NotFound, missing_extra, reason
from ckptscan.storage.ranged import TIMEOUT_S, RangedReader, retry_backoff_s
from ckptscan.storage.remote_path import Listing, ObjectInfo

if TYPE_CHECKING:  # obstore is an optional extra: imported when a store is opened
    from obstore.store import ClientConfig, RetryConfig

# The schemes obstore serves, and the kind of store each names.
OBSTORE_SCHEMES = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs", "az": "azure", "abfs": "azure",
                   "abfss": "azure", "azure": "azure"}


class ObstoreStore(RangedReader):
    def __init__(self, scheme: str, root: str):
        super().__init__()
        self.url = f"{scheme}://{root}"
        try:
            import obstore
            from obstore import exceptions
            from obstore.store import from_url
        except ImportError:
            raise missing_extra(scheme, self.url) from None
        self._obstore, self._errors = obstore, exceptions
        kind = OBSTORE_SCHEMES[scheme]
        client: ClientConfig = {"timeout": timedelta(seconds=TIMEOUT_S), "connect_timeout": timedelta(seconds=10)}
        options: dict[str, Any] = {}
        if kind == "s3":
            endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or ""
            if endpoint:
                # Path-style URLs (endpoint/bucket/key): what S3-compatible servers expect.
                options["virtual_hosted_style_request"] = False
            provider = _boto3_profile()
            if provider is not None:
                options["credential_provider"] = provider
        elif kind == "gcs":
            options["config"] = _gcs_emulator()
            endpoint = options["config"].get("base_url", "")
        else:
            options["config"] = _azure_connection_string()
            endpoint = options["config"].get("endpoint") or os.environ.get("AZURE_STORAGE_ENDPOINT") or ""
        if endpoint.startswith("http://"):  # a local server (MinIO, moto, fake-gcs-server, Azurite) without TLS
            client["allow_http"] = True
        # The client's own retries (5xx, throttling, connection errors) with
        # exponential backoff and jitter; RangedReader retries whole parts on top.
        retry: RetryConfig = {"max_retries": 3, "retry_timeout": timedelta(seconds=4 * TIMEOUT_S),
                 "backoff": {"init_backoff": timedelta(seconds=retry_backoff_s() / 2),
                             "max_backoff": timedelta(seconds=10),
                             "base": 2}}
        try:
            self._store = from_url(f"{scheme}://{root}", client_options=client, retry_config=retry, **options)
        except Exception as e:  # bad configuration in the environment
            # The first line only: object_store appends a multi-line debug dump.
            raise CkptScanError(f"cannot configure the {kind} client: {reason(e)}", path=self.url) from None

    def _translate(self, e: Exception) -> Exception:
        if isinstance(e, self._errors.NotFoundError):
            return NotFound()
        if isinstance(e, (self._errors.PermissionDeniedError, self._errors.UnauthenticatedError)) or \
                "status code: 403" in str(e):
            return Denied(reason(e))
        return e

    def _list(self, prefix: str) -> Listing:
        try:
            result = self._obstore.list_with_delimiter(self._store, prefix.rstrip("/") or None)
        except Exception as e:
            raise self._translate(e) from None
        files = {o["path"].rsplit("/", 1)[-1]: ObjectInfo(o["size"], o.get("e_tag") or o.get("version"))
                 for o in result["objects"]}
        dirs = frozenset(p.rstrip("/").rsplit("/", 1)[-1] for p in result["common_prefixes"])
        return Listing(files, dirs)

    def _list_tree(self, prefix: str) -> list[tuple[str, ObjectInfo]]:
        try:
            return [(o["path"], ObjectInfo(o["size"], o.get("e_tag") or o.get("version")))
                    for batch in self._obstore.list(self._store, prefix.rstrip("/") or None, chunk_size=1000)
                    for o in batch]
        except Exception as e:
            raise self._translate(e) from None

    def _get(self, key: str, start: int, end: int) -> Any:
        try:
            return self._obstore.get_range(self._store, key, start=start, end=end)
        except Exception as e:
            raise self._translate(e) from None


def _gcs_emulator() -> dict[str, Any]:
    """`STORAGE_EMULATOR_HOST` (a host:port or URL, as google-cloud-storage
    reads it): that endpoint, unsigned, as emulators such as fake-gcs-server
    expect. Without it, object_store's own GOOGLE_* chain."""
    host = os.environ.get("STORAGE_EMULATOR_HOST")
    if not host:
        return {}
    return {"base_url": host if "://" in host else f"http://{host}", "skip_signature": True}


def _azure_connection_string() -> dict[str, Any]:
    """The account, key, SAS and blob endpoint of
    `AZURE_STORAGE_CONNECTION_STRING` (what the Azure SDKs and CLI read, and
    Azurite documents), which object_store does not parse itself.
    `UseDevelopmentStorage=true` is Azurite on its default port."""
    text = os.environ.get("AZURE_STORAGE_CONNECTION_STRING")
    if not text:
        return {}
    fields = dict(part.split("=", 1) for part in text.split(";") if "=" in part)
    if fields.get("UseDevelopmentStorage", "").lower() == "true":
        return {"use_emulator": True}
    config = {"account_name": fields.get("AccountName"), "account_key": fields.get("AccountKey"),
              "sas_key": fields.get("SharedAccessSignature"), "endpoint": fields.get("BlobEndpoint")}
    if not config["endpoint"] and fields.get("AccountName") and fields.get("EndpointSuffix"):
        protocol = fields.get("DefaultEndpointsProtocol", "https")
        config["endpoint"] = f"{protocol}://{fields['AccountName']}.blob.{fields['EndpointSuffix']}"
    return {key: value for key, value in config.items() if value}


def _boto3_profile() -> Any:
    """boto3's credential chain when the user relies on a named profile, which
    object_store's own chain does not read; None otherwise."""
    if os.environ.get("AWS_ACCESS_KEY_ID"):
        return None
    config_dir = Path(os.environ.get("AWS_SHARED_CREDENTIALS_FILE", Path.home() / ".aws" / "credentials")).parent
    if not os.environ.get("AWS_PROFILE") and not config_dir.is_dir():
        return None
    try:
        from obstore.auth.boto3 import Boto3CredentialProvider
    except ImportError:  # no boto3: object_store's chain (env, web identity, instance metadata)
        return None
    return Boto3CredentialProvider()
